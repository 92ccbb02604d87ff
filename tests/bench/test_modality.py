"""fairagents bench modality renders its result (the run itself is measured by the CLI, not here)."""

from fairagents.bench import modality


def test_render_names_every_mode_and_app():
    row = {"ttft_p50_s": 0.01, "ttft_p99_s": 0.02, "requests": 3}
    apps = {a: {"raw_tokens": 10.0, "unified_tokens": 1.0, "slot_seconds": 1.0, "requests": 1.0} for a in modality.APPS}
    result = {
        "load": {"images": 4, "image_side": 64, "text_requests": 3, "text_tokens": 2, "seconds": 1.0, "pool": 3},
        "isolation": {m: row for m in ("unloaded", "pool", "inline")},
        "shares": {p: {"apps": apps, "spread": {"raw_tokens": 0.0, "unified_tokens": 0.0, "slot_seconds": 0.0}}
                   for p in modality.POLICIES},
    }
    first, second = modality.render(result)
    assert first.row_count == 3 and second.row_count == 2 * 4
    assert modality._spread([1.0, 2.0, 3.0]) == 1.0
