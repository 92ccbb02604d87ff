"""The worked example of the unified-tokens page; the asserts are the page's numbers."""

import fairagents as fa

cost = fa.UnifiedTokenCost(
    {
        "text": fa.ModelProfile(d_model=4096, n_layers=32),
        "vision": fa.ModelProfile(d_model=2048, n_layers=24, modality=fa.Modality.VISION),
        "image": fa.ModelProfile(d_model=1152, n_layers=28, modality=fa.Modality.IMAGE),
    }
)  # d_base=4096, w_input=1, w_output=2

# --8<-- [start:charges]
text = cost.input_cost("text", 200) + cost.output_cost("text", 100)
vision = cost.input_cost("vision", 400 + 50) + cost.output_cost("vision", 60)
print(text, vision)  # 12800.0 6840.0
# --8<-- [end:charges]
assert (text, vision) == (12_800.0, 6_840.0)

# --8<-- [start:image]
patches = (512 // 8 // 2) ** 2  # VAE downsamples 8x, patch size 2: 32 x 32 = 1,024 patches
steps = 20
image = cost.output_cost("image", patches * steps)
print(image)  # 322560.0: one 512x512 image costs as much as ~25 such text requests
# --8<-- [end:image]
assert patches == 1_024 and image == 2 * 7.875 * 20_480
