"""Durations of the API are parsed once: a spec's duration field is :class:`api.Seconds`, float seconds
that keep the text the user wrote (what a dump writes back), and the CRD still says ``type: string``
with the duration pattern."""

from __future__ import annotations

import pickle

import pydantic
import pytest
from kubeinfer.operator import api, crdgen
from kubeinfer.runtime.config import BatchingConfig

from kubeinfer.contract.batching import MAX_QUEUE_DELAY_LIMIT_SECONDS


def test_seconds_is_the_value_in_seconds_and_keeps_its_text() -> None:
    d = api.Seconds("1500ms")
    assert d == 1.5 and isinstance(d, float) and str(d) == "1500ms" and repr(d) == "Seconds('1500ms')"
    assert min(d, api.Seconds("2s")) == 1.5 and d * 2 == 3.0
    assert pickle.loads(pickle.dumps(d)).text == "1500ms"
    with pytest.raises(ValueError, match="invalid duration '5 ms'"):
        api.Seconds("5 ms")
    with pytest.raises(ValueError, match="invalid duration"):  # as the CRD's pattern (RE2) refuses it
        api.Seconds("10s\n")


def test_spec_durations_are_seconds_and_dump_as_written() -> None:
    spec = api.InferenceServiceSpec.model_validate(
        {
            "batching": {"maxQueueDelay": "1500us"},
            "autoscaling": {"enabled": True, "targetP99": "0.25s", "maxQueueDelay": {"max": "40ms"}},
        }
    )
    assert spec.batching.max_queue_delay == pytest.approx(0.0015)
    assert spec.autoscaling.target_p99 == 0.25 and spec.autoscaling.max_queue_delay.max == 0.04
    assert spec.autoscaling.window == 60.0  # a default is a Seconds too
    dumped = spec.model_dump(by_alias=True, mode="json")
    assert dumped["batching"]["maxQueueDelay"] == "1500us"  # the user's text, not a re-rendering
    assert dumped["autoscaling"]["targetP99"] == "0.25s" and dumped["autoscaling"]["window"] == "60s"
    assert spec.model_dump(by_alias=True)["autoscaling"]["maxQueueDelay"]["max"] == "40ms"
    again = api.InferenceServiceSpec.model_validate(dumped)
    assert again == spec and again.batching.max_queue_delay.text == "1500us"


def test_a_bad_duration_names_its_field() -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        api.InferenceServiceSpec.model_validate({"batching": {"maxQueueDelay": "5 ms"}})
    assert err.value.errors()[0]["loc"] == ("batching", "maxQueueDelay")
    assert "invalid duration '5 ms'" in err.value.errors()[0]["msg"]
    with pytest.raises(pydantic.ValidationError):
        api.InferenceServiceSpec.model_validate(
            {"batching": {"maxQueueDelay": 0.005}}
        )  # a number is not text


def test_the_crd_schema_of_a_duration_is_a_string_with_the_pattern() -> None:
    schema = api.BatchingSpec.model_json_schema(by_alias=True)
    schema["properties"]["maxQueueDelay"].pop("title", None)
    assert schema["properties"]["maxQueueDelay"] == {
        "type": "string",
        "maxLength": 64,
        "pattern": api.DURATION_PATTERN,
        "default": "5ms",
        "description": schema["properties"]["maxQueueDelay"]["description"],
    }


@pytest.mark.parametrize(("old", "new"), sorted(api.RENAMED_AUTOSCALING_FIELDS.items()))
def test_a_renamed_field_is_refused_naming_the_new_one(old: str, new: str) -> None:
    message = f"spec.autoscaling.{old} is now spec.autoscaling.{new}"
    with pytest.raises(pydantic.ValidationError, match=message):
        api.InferenceServiceSpec.model_validate({"autoscaling": {"enabled": True, old: "15s"}})
    # the CRD keeps the old field, typed as the new one (CEL sees typed fields only) so that it is not
    # pruned without a word, only for a rule that refuses it
    schema = crdgen.model_schema(api.AutoscalingSpec, with_defaults=True)
    typed = schema["properties"][new]["type"]
    assert typed == ("object" if old == "batchTimeout" else "string")
    assert schema["properties"][old] == {
        "description": f"Renamed: now spec.autoscaling.{new} (refused here, the message names it).",
        "type": typed,
        **({"x-kubernetes-preserve-unknown-fields": True} if typed == "object" else {}),
    }
    rule = next(r for r in schema["x-kubernetes-validations"] if r.get("fieldPath") == f".{old}")
    assert rule == {
        "rule": f"!has(self.{old})",
        "message": message,
        "fieldPath": f".{old}",
        "reason": "FieldValueForbidden",
    }


def test_the_max_queue_delay_is_seconds_from_the_status_and_bounded_once() -> None:
    status = api.InferenceServiceStatus.from_k8s({"maxQueueDelay": "12.5ms", "batchTimeout": "3ms"})
    assert status.max_queue_delay == pytest.approx(0.0125) and str(status.max_queue_delay) == "12.5ms"
    limit = f"{MAX_QUEUE_DELAY_LIMIT_SECONDS}s"
    over = f"{MAX_QUEUE_DELAY_LIMIT_SECONDS + 1}s"
    with pytest.raises(pydantic.ValidationError, match=f"maxQueueDelay must be at most {limit}"):
        api.InferenceServiceSpec.model_validate({"batching": {"maxQueueDelay": over}})
    with pytest.raises(pydantic.ValidationError, match=f"maxQueueDelay.max must be at most {limit}"):
        api.InferenceServiceSpec.model_validate({"autoscaling": {"maxQueueDelay": {"max": over}}})
    with pytest.raises(pydantic.ValidationError, match="less than or equal to 10"):
        BatchingConfig(max_queue_delay_seconds=MAX_QUEUE_DELAY_LIMIT_SECONDS + 1)
