"""What every scenario model is built from: the base model, strict number types, and the errors of a bad scenario.

Every model of a scenario file forbids unknown fields and reads its fields'
documentation from their attribute docstrings (``_Spec``). A problem a model finds
while validating is raised as a pydantic error carrying its field path (``_problem``),
which :func:`~fairagents.bench.spec.load_scenario` turns into a :class:`ScenarioProblem`
with the line of the YAML file; a scenario that cannot be loaded or built raises a
:class:`ScenarioError`, bad input (a :class:`ValueError`) like any invalid parameter.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, Strict
from pydantic_core import PydanticCustomError

from fairagents.errors import InvalidParameterError

__all__ = ["ScenarioError", "ScenarioProblem"]

MAX_INT = 2**31 - 1
"""The largest integer a scenario's counts and lengths take: larger ones overflow the arrays they fill."""
PositiveInt = Annotated[int, Strict(), Field(gt=0, le=MAX_INT)]
FiniteFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
"""A finite number (an integer is one too)."""
PositiveFloat = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Cycled = PositiveFloat | Annotated[list[PositiveFloat], Field(min_length=1)]
"""A number, or a list of numbers cycled over the replicas of a ``count``-ed entry."""


class ScenarioProblem(NamedTuple):
    """One thing wrong in a scenario: where (field path, line) and what.
    """

    path: str
    """Dotted path of the field (``apps.chat.agents.bot.arrival.rate``); empty for the whole file."""
    line: int | None
    """1-based line in the file, when known."""
    message: str
    """What is wrong."""


class ScenarioError(InvalidParameterError):
    """A scenario that cannot be loaded or built; the message names the file, the field path and the line.

    ``source`` is the file (or built-in name), ``problems`` the :class:`ScenarioProblem` list.

    Examples:
        >>> from fairagents.bench.spec import ScenarioError, ScenarioProblem
        >>> str(ScenarioError.of("chat.yaml", [ScenarioProblem("apps.chat.weight", 4, "must be > 0")]))
        'chat.yaml:4: apps.chat.weight: must be > 0'
    """

    def __init__(self, message: str, *, source: str | None = None,
                 problems: list[ScenarioProblem] | None = None) -> None:
        super().__init__(message)
        self.source = source
        self.problems = list(problems or [])

    @classmethod
    def of(cls, source: str, problems: list[ScenarioProblem]) -> ScenarioError:
        """The error for ``problems`` in ``source``: one line each, ``file:line: path: message``."""
        lines = [
            f"{source}{f':{p.line}' if p.line is not None else ''}: {f'{p.path}: ' if p.path else ''}{p.message}"
            for p in problems
        ]
        head = lines[0] if len(lines) == 1 else f"{source}: {len(lines)} problems\n" + "\n".join(lines)
        return cls(head, source=source, problems=problems)


def _problem(message: str, loc: tuple[str | int, ...] = ()) -> PydanticCustomError:
    """A validation error at ``loc`` below the model that raises it (read back by :func:`load_scenario`)."""
    where = ".".join(str(p) for p in loc)
    return PydanticCustomError("scenario", "{where}: {message}" if where else "{message}",
                               {"message": message, "loc": loc, "where": where})


def _runtime(fn: Any, *args: Any, loc: tuple[str, ...] = ()) -> Any:
    """Build a runtime object, turning its parameter error into a validation error (at ``loc`` in the spec)."""
    try:
        return fn(*args)
    except InvalidParameterError as err:
        raise _problem(str(err), loc) from None


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


def _pick(value: float | list[float], k: int) -> float:
    return value[k % len(value)] if isinstance(value, list) else value


def _lists(value: Any) -> bool:
    """Whether a spec holds a list to cycle (in its own fields or nested specs)."""
    if isinstance(value, list):
        return True
    if isinstance(value, BaseModel):
        return any(_lists(getattr(value, name)) for name in type(value).model_fields if name != "segments")
    return False
