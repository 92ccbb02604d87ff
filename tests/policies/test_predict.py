"""The shared output-length predictor: per (agent, modality) lines, fallbacks, clamping, measured error."""

import random

import fairagents as fa
from fairagents.policies.predict import LengthPredictor

A = fa.Agent("writer", fa.App("docs"))
B = fa.Agent("critic", fa.App("docs"))


def test_a_key_uses_its_own_line_once_it_has_enough_samples_and_falls_back_before():
    p = LengthPredictor(min_samples=3)
    for prompt in (10, 20, 30):
        p.observe(A, fa.Modality.TEXT, prompt, 2 * prompt)  # writer: output = 2 × prompt
    assert p.predict(A, fa.Modality.TEXT, 50, max_tokens=1000) == 100
    assert p.predict(B, fa.Modality.TEXT, 50, max_tokens=1000) == 100  # critic: the modality's line
    assert p.predict(B, fa.Modality.VISION, 50, max_tokens=1000) == 100  # no vision yet: the global line
    for prompt in (10, 20, 30):
        p.observe(B, fa.Modality.TEXT, prompt, 7)
    assert p.predict(B, fa.Modality.TEXT, 50, max_tokens=1000) == 7  # its own, flat line
    assert p.predict(A, fa.Modality.TEXT, 50, max_tokens=1000) == 100


def test_predictions_stay_within_one_and_max_tokens():
    p = LengthPredictor(min_samples=2)
    p.observe(A, fa.Modality.TEXT, 100, 1)
    p.observe(A, fa.Modality.TEXT, 10, 500)  # a steeply falling line
    assert p.predict(A, fa.Modality.TEXT, 10_000, max_tokens=64) == 1
    assert p.predict(A, fa.Modality.TEXT, 0, max_tokens=64) == 64


def test_the_error_is_measured_before_learning_and_shrinks_on_a_learnable_stream():
    rng = random.Random(0)
    p = LengthPredictor(min_samples=5)
    early = late = 0.0
    for i in range(400):
        prompt = rng.randint(10, 500)
        out = int(0.5 * prompt + 20 + rng.gauss(0, 5))
        before = p.error.absolute
        p.observe(A, fa.Modality.TEXT, prompt, out, max_tokens=1024)
        step = p.error.absolute - before
        early += step if i < 20 else 0
        late += step if i >= 380 else 0
    assert p.error.samples == 400
    assert late / 20 < 10 < early / 20  # within ~2σ once learned; far off at first
    assert 0 < p.error.mean_relative < 1
