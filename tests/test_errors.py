import pytest

import fairagents as fa

BAD_INPUT = [
    fa.InvalidParameterError,
    fa.UnknownModelError,
    fa.UnknownAppError,
    fa.UnknownAgentError,
    fa.ContextLengthError,
]


@pytest.mark.parametrize("error", BAD_INPUT)
def test_bad_input_is_a_value_error(error):
    assert issubclass(error, fa.BadInputError)
    assert issubclass(error, ValueError)
    assert issubclass(error, fa.FairAgentsError)


def test_engine_error_is_not_bad_input():
    assert issubclass(fa.EngineError, fa.FairAgentsError)
    assert not issubclass(fa.EngineError, ValueError)


def test_tree_in_docstring_names_every_error():
    import fairagents.errors as errors

    for name in errors.__all__:
        assert name in errors.__doc__
