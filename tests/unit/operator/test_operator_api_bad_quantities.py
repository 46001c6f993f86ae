"""InferenceService quantities the API server used to let through (schema pattern copied from
apimachinery's loose pre-check) are refused by the spec model, so a stored one becomes a Ready=False
InvalidSpec condition instead of an endless retry."""

from __future__ import annotations

import re

import pydantic
import pytest
from kubeinfer.operator.api import QUANTITY_PATTERN, AutoscalingSpec, QuantizationSpec, ResourcesSpec


@pytest.mark.parametrize(
    "value", ["-1", "0", "0.0", "0Gi", ".", "1.2.3", "+2", "1Gib", "", "1 Gi", "Gi", "1e"]
)
@pytest.mark.parametrize("field", ["cpu", "memory"])
def test_non_positive_or_malformed_quantity_is_refused(field: str, value: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        ResourcesSpec.model_validate({field: value})


@pytest.mark.parametrize(
    "value", ["2", "500m", "8Gi", "1.5", "0.5", ".5", "1.", "100Mi", "1Ki", "4G", "250k", "1e3", "1E2", "10n"]
)
def test_valid_quantities_pass(value: str) -> None:
    assert re.match(QUANTITY_PATTERN, value)
    assert ResourcesSpec.model_validate({"cpu": value, "memory": value}).memory == value


@pytest.mark.parametrize("value", ["x" * 64, "NVIDIA H100", "-H100", "H100/80GB"])
def test_gpu_product_must_be_a_label_value(value: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=r"gpu_product|gpuProduct"):
        ResourcesSpec.model_validate({"gpus": 1, "gpuProduct": value})


def test_real_gpu_product_passes() -> None:
    spec = ResourcesSpec.model_validate({"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3"})
    assert spec.gpu_product == "NVIDIA-H100-80GB-HBM3"


def test_zero_autoscaling_window_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="window must be greater than 0"):
        AutoscalingSpec.model_validate({"window": "0s"})


def test_empty_skip_module_prefix_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"skipModules|skip_modules"):
        QuantizationSpec.model_validate({"mode": "int8-dynamic", "skipModules": [""]})
