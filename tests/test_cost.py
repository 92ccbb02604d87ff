import pytest
from hypothesis import given
from hypothesis import strategies as st

import fairagents as fa


def test_unified_tokens_follow_hmfs_eq1():
    cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=2048, n_layers=24)}, d_base=4096)
    assert cost.unified_tokens("m", 100) == 100 * 2048 / 4096 * 24
    assert cost.input_cost("m", 100) == 1.0 * 1200.0
    assert cost.output_cost("m", 100) == 2.0 * 1200.0


def test_weights_and_d_base_are_settings():
    cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=128, n_layers=2)}, d_base=128, w_input=0.5, w_output=3)
    assert cost.input_cost("m", 4) == 4.0
    assert cost.output_cost("m", 4) == 24.0


def test_a_vision_token_and_a_text_token_are_comparable():
    cost = fa.UnifiedTokenCost(
        {
            "big-text": fa.ModelProfile(d_model=4096, n_layers=32),
            "small-vlm": fa.ModelProfile(d_model=1024, n_layers=16, modality=fa.Modality.VISION),
        }
    )
    # one big-text token costs as much as eight small-vlm tokens
    assert cost.unified_tokens("big-text", 1) == cost.unified_tokens("small-vlm", 8)


def test_unknown_model_is_bad_input():
    cost = fa.UnifiedTokenCost({"a": fa.ModelProfile(d_model=64, n_layers=1)})
    for method in (cost.unified_tokens, cost.input_cost, cost.output_cost):
        with pytest.raises(fa.UnknownModelError, match="known models: a"):
            method("b", 1)


@pytest.mark.parametrize("n", [-1, 1.5, "3", True, None])
@pytest.mark.parametrize("cost", [fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)}), fa.RawTokenCost()])
def test_token_counts_must_be_non_negative_integers(cost, n):
    with pytest.raises(fa.InvalidParameterError):
        cost.input_cost("m", n)
    with pytest.raises(fa.InvalidParameterError):
        cost.output_cost("m", n)


def test_numpy_integers_are_counts():
    np = pytest.importorskip("numpy")
    assert fa.RawTokenCost().output_cost("m", np.int64(3)) == 6.0


@pytest.mark.parametrize(
    "kwargs", [{"d_model": 0, "n_layers": 1}, {"d_model": 64, "n_layers": -2}, {"d_model": 64.0, "n_layers": 2}]
)
def test_profile_validation(kwargs):
    with pytest.raises(fa.InvalidParameterError):
        fa.ModelProfile(**kwargs)


@pytest.mark.parametrize("kwargs", [{"d_base": 0}, {"w_input": -1}, {"w_output": float("nan")}, {"w_cached": -0.5},
                                    {"w_cached": float("inf")}])
def test_cost_settings_validation(kwargs):
    with pytest.raises(fa.InvalidParameterError):
        fa.UnifiedTokenCost(**kwargs)


def test_register_rejects_non_profiles():
    with pytest.raises(fa.InvalidParameterError):
        fa.UnifiedTokenCost().register("m", {"d_model": 64})


def test_cost_models_satisfy_protocol():
    assert isinstance(fa.UnifiedTokenCost(), fa.CostModel)
    assert isinstance(fa.RawTokenCost(), fa.CostModel)


def test_service_bound_sums_models_and_uses_the_larger_weight():
    cost = fa.UnifiedTokenCost(
        {"a": fa.ModelProfile(d_model=4096, n_layers=1), "b": fa.ModelProfile(d_model=2048, n_layers=1)},
        w_input=3.0,
        w_output=2.0,
    )
    assert fa.service_bound(cost, {"a": 100}) == 300.0
    assert fa.service_bound(cost, {"a": 100, "b": 100}) == 300.0 + 150.0


@given(st.integers(1, 8192), st.integers(1, 128), st.integers(0, 10_000))
def test_cost_is_linear_and_non_negative(d_model, n_layers, n):
    cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=d_model, n_layers=n_layers)})
    assert cost.output_cost("m", n) >= 0
    assert cost.output_cost("m", n) == pytest.approx(2 * cost.input_cost("m", n))
    assert cost.unified_tokens("m", n) == pytest.approx(n * cost.unified_tokens("m", 1))


@pytest.mark.parametrize("cost", [fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=2)}),
                                  fa.RawTokenCost()], ids=["unified", "raw"])
def test_prompt_tokens_read_from_the_prefix_cache_cost_w_cached(cost):
    scale = 2.0 if isinstance(cost, fa.UnifiedTokenCost) else 1.0
    assert cost.w_cached == 0.1
    assert cost.cached_cost("m", 10) == pytest.approx(0.1 * 10 * scale)
    assert fa.prompt_cost(cost, "m", 100) == cost.input_cost("m", 100)
    assert fa.prompt_cost(cost, "m", 100, cached=90) == pytest.approx((10 + 9) * scale)
    assert fa.prompt_cost(cost, "m", 100, cached=100) == pytest.approx(10 * scale)


@pytest.mark.parametrize("cached", [-1, 101, 1.5, True, "3"])
def test_a_cached_count_outside_the_prompt_is_bad_input(cached):
    with pytest.raises(fa.InvalidParameterError, match="cached prompt tokens"):
        fa.prompt_cost(fa.RawTokenCost(), "m", 100, cached)


def test_a_cost_model_of_ones_own_without_cached_cost_charges_hits_as_computed():
    class Flat:
        def input_cost(self, model, n):
            return float(n)

        def output_cost(self, model, n):
            return 2.0 * n

    assert fa.prompt_cost(Flat(), "m", 100, cached=90) == 100.0


def test_the_service_bound_covers_a_cached_token_dearer_than_the_others():
    cost = fa.UnifiedTokenCost({"a": fa.ModelProfile(d_model=4096, n_layers=1)}, w_cached=5.0)
    assert fa.service_bound(cost, {"a": 100}) == 500.0
