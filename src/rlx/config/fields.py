"""What every config section shares: unknown keys refused, numbers finite and within 64 bits,
XTuner fields rlx cannot act on refused unless left at their default, and algorithm names checked
against :mod:`rlx.algo.registry`."""

from __future__ import annotations

import types
from functools import partial
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from rlx.algo import registry
from rlx.errors import UserError


class ConfigError(UserError):
    """The configuration file or an override is invalid."""


UNSUPPORTED = "kept for XTuner compatibility, not supported"


def unsupported(default: Any, reason: str) -> Any:
    """A field XTuner has and rlx cannot act on: its default is accepted (so a carried-over config loads),
    any other value is refused with ``reason`` rather than silently ignored."""
    return Field(
        default,
        description=f"{UNSUPPORTED[0].upper()}{UNSUPPORTED[1:]}: {reason}",
        json_schema_extra={"unsupported": reason},
    )


def _registered(kind: str, name: str) -> str:
    known = registry.names(kind)  # the first call imports the algorithm modules (and torch)
    if name not in known:
        quoted = [repr(option) for option in known]
        listed = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
        raise ValueError(f"Input should be a registered {registry.KINDS[kind]}: {listed}")
    return name


def _list_registered(kind: str, schema: dict[str, Any]) -> None:
    schema["enum"] = registry.names(kind)


def registered(kind: str) -> Any:
    """The type of a field that names an algorithm of ``kind`` in :mod:`rlx.algo.registry`: the names
    are spelled once, where their functions are registered, and the schema lists them."""
    return Annotated[
        str, AfterValidator(partial(_registered, kind)), Field(json_schema_extra=partial(_list_registered, kind))
    ]


AdvantageName = registered("advantage")


PolicyLossName = registered("policy_loss")


KLName = registered("kl")


LossAggName = registered("loss_agg")


CorrectionName = registered("correction")


def unsupported_reason(field) -> str | None:
    """Why a field is refused unless left at its default (see :func:`unsupported`), or None."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}  # or a schema hook
    return extra.get("unsupported")


def plain_kind(annotation: Any) -> type | None:
    """``int`` or ``bool`` when a field's annotation allows that type alone (besides None), else None."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, types.UnionType):
        allowed = [arg for arg in get_args(annotation) if arg is not type(None)]
        annotation = allowed[0] if len(allowed) == 1 else None
    return annotation if annotation in (int, bool) else None


class Section(BaseModel):
    """Base of every config section: unknown keys are rejected, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _counts_and_flags_as_written(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic's lax mode reads true as 1, 2.0 as 2 and "yes" as true: a count or a flag that is not
        written as one was most likely meant as something else, so it is refused instead."""
        kind = plain_kind(cls.model_fields[info.field_name].annotation)
        if value is None or kind is None or isinstance(value, str):  # text: pydantic's own words say why not
            return value
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError("Input should be a whole number, written without a point and not as true or false")
        if kind is bool and not isinstance(value, bool):
            raise ValueError("Input should be true or false")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _fits_in_64_bits(cls, value: Any) -> Any:
        """Python ints are unbounded, the tensors, seeds and counters they end up in are not."""
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise ValueError("must fit in 64 bits (below 2^63 in size)")
        return value

    @field_validator("*")
    @classmethod
    def _supported(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields[info.field_name]
        reason = unsupported_reason(field)
        if reason and value != field.default:
            raise ValueError(f"{UNSUPPORTED}: {reason}")
        return value
