"""The demo's load: its apps and agents, their weights and callers, the layouts, and what the simulator replays.

Examples:
    >>> from fairagents.demo.load import AGENTS
    >>> sorted({app for app, *_ in AGENTS}), sorted({model for _, _, _, _, model, *_ in AGENTS})
    (['driving', 'flood', 'studio'], ['chat', 'image', 'vision'])
"""

from __future__ import annotations

from fairagents.images import to_png

__all__ = ["AGENTS", "APPS", "BACKLOGGED", "CHAT_BATCH", "IMAGE_SIZE", "IMAGE_STEPS", "IMAGE_STEP_TOKENS", "LAYOUTS",
           "PROMPT_TOKENS", "SERIAL", "camera_frame"]

#: app → weight.
APPS = {"driving": 2.0, "studio": 1.0, "flood": 1.0}
#: (app, agent, agent weight, concurrent callers, model, max_tokens, prompt).
AGENTS = [
    ("driving", "planner", 2.0, 6, "chat", 48, "Plan a safe route from the depot to the harbour avoiding the closed bridge."),
    ("driving", "perception", 1.0, 6, "vision", 24, "Describe the obstacles ahead in this camera frame."),
    ("studio", "writer", 1.0, 6, "chat", 64, "Write the opening paragraph of a story about a lighthouse keeper."),
    ("studio", "illustrator", 1.0, 2, "image", 0, "A lighthouse on a cliff at dusk, watercolour."),
    ("flood", "chatty", 1.0, 60, "chat", 32, "Tell me something. Anything. Then tell me more."),
]
#: Sequences the LLM runs at once in the demo (as GPU memory would bound it): the flood's 60 callers fill it.
CHAT_BATCH = 32
#: Images the illustrator asks for: (width, height) and denoising steps.
IMAGE_SIZE, IMAGE_STEPS = (64, 64), 8


def camera_frame() -> bytes:
    """A synthetic road scene as PNG bytes (what ``perception`` sends with each question)."""
    from PIL import Image, ImageDraw

    frame = Image.new("RGB", (96, 64), (135, 190, 235))
    draw = ImageDraw.Draw(frame)
    draw.polygon([(0, 64), (96, 64), (60, 28), (36, 28)], fill=(90, 90, 90))
    draw.rectangle((70, 18, 76, 34), fill=(30, 30, 30))
    draw.ellipse((71, 19, 75, 23), fill=(230, 30, 30))
    draw.rectangle((40, 40, 52, 52), fill=(240, 240, 240))
    return to_png(frame)


#: The layouts the demo runs: every model on one device (the embedded pool: one CPU), or each on its own.
LAYOUTS = ("one", "separate")
#: An agent wants more than it got when it had a request waiting (not yet started) this share of the load's time;
#: an app, when one of its agents does.
BACKLOGGED = 0.5
#: Prompt tokens of each agent's request as the embedded models count them (the chat template; for ``perception``,
#: the camera frame's image tokens too; for ``illustrator``, the caption as the image model's text encoder keeps it).
PROMPT_TOKENS = {("driving", "planner"): 53, ("driving", "perception"): 71, ("studio", "writer"): 47,
                 ("studio", "illustrator"): 32, ("flood", "chatty"): 32}
#: Latent tokens a denoising step of one demo image produces (the image model charges them per step).
IMAGE_STEP_TOKENS = 256
#: Which engines step one at a time on this machine's CPU: vLLM's in-process engines do (their forward context is
#: global to the process); the diffusion engine runs beside them.
SERIAL = {"chat": "vllm", "vision": "vllm", "image": "diffusers"}
