"""What the cluster can serve that not every Kubernetes version can. Pure: no I/O.

An ``oci://`` model (``spec.model.uri``) is mounted as an image volume (``volumes[].image``): alpha in
Kubernetes 1.31 (feature gate ``ImageVolume`` off), beta but still off by default in 1.33 and 1.34, on
by default from 1.35, GA (locked on) from 1.36. An API server with the gate off refuses such a pod spec
or drops the volume, so the operator does not apply one there: the InferenceService gets
``Ready=False`` reason ``ImageVolumeUnsupported``, naming the cluster's version and what to do,
and nothing is applied.

The operator reads the API server's version once at start (``GET /version``, its ``gitVersion``) and
the admin's setting ``image_volumes`` (chart value ``imageVolumes``): ``True`` (the gate is on, e.g. on
1.33 or 1.34) never refuses, ``False`` always refuses, ``None`` (``auto``, the default) refuses below
:data:`IMAGE_VOLUMES_DEFAULT_FROM`. A version that is unknown (the request failed) or unreadable refuses
nothing: the API server still has the last word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kubeinfer.operator import api, conditions
from kubeinfer.operator.status import ConditionState

#: The first Kubernetes minor version with the ImageVolume feature gate on by default.
IMAGE_VOLUMES_DEFAULT_FROM = (1, 35)
#: ``v1.34.2``, ``1.34``, ``v1.34.2-eks-abc``, ``v1.30.5-gke.1014001``: the major and minor version.
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\D|$)")
#: What a user can do instead of an image volume, in the refusals' words.
_INSTEAD = "serve the model from s3://, https://, hf:// or pvc://"


def parse_version(git_version: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a Kubernetes ``gitVersion`` (``v1.34.2``, ``v1.34.2-eks-abc``); ``None`` when
    it is unknown or reads as no version."""
    match = _VERSION.match((git_version or "").strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class ClusterCapabilities:
    """The API server's ``gitVersion`` (``None``: unknown) and the admin's ``image_volumes`` setting
    (``True``: the ImageVolume feature gate is on, ``False``: do not use image volumes, ``None``: auto,
    from the version). The default refuses nothing."""

    server_version: str | None = None
    image_volumes: bool | None = None

    def image_volumes_served(self) -> bool | None:
        """Whether image volumes can be used: the setting, else whether the version has them on by
        default; ``None`` when neither says (the version is unknown or unreadable)."""
        if self.image_volumes is not None:
            return self.image_volumes
        version = parse_version(self.server_version)
        return None if version is None else version >= IMAGE_VOLUMES_DEFAULT_FROM

    def describe(self) -> str:
        """The capabilities in words, for the operator's log at start."""
        version = self.server_version or "unknown"
        setting = {True: "true", False: "false", None: "auto"}[self.image_volumes]
        served = {True: "used", False: "refused", None: "used (version unknown)"}[self.image_volumes_served()]
        return f"API server {version}; image volumes (oci:// models, imageVolumes: {setting}): {served}"

    def refusal(self, isvc: api.InferenceService) -> ConditionState | None:
        """``Ready=False`` ``ImageVolumeUnsupported`` for an ``oci://`` model where image volumes
        cannot be used, naming the cluster's version and what to do; ``None`` otherwise."""
        if api.oci_reference(isvc.spec.model.uri) is None or self.image_volumes_served() is not False:
            return None
        version = self.server_version or "of an unknown version"
        if self.image_volumes is False:
            message = (
                "spec.model.uri: oci:// models are mounted as image volumes, which this operator is set "
                f"not to use (the chart value imageVolumes: false; this cluster's API server is {version}); "
                f"set imageVolumes: auto or true where the cluster serves them, or {_INSTEAD}; "
                "nothing was applied"
            )
        else:
            major, minor = IMAGE_VOLUMES_DEFAULT_FROM
            message = (
                "spec.model.uri: oci:// models are mounted as image volumes, on by default from Kubernetes "
                f"{major}.{minor}; this cluster's API server is {version} (enable the ImageVolume feature "
                "gate on the API server and the kubelets and set the chart value imageVolumes: true, or "
                f"{_INSTEAD}); nothing was applied"
            )
        return ConditionState("False", conditions.IMAGE_VOLUME_UNSUPPORTED, message)
