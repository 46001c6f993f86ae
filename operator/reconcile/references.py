"""Which Secrets and ServiceAccounts an InferenceService may name. Pure: no I/O.

The operator creates the runtime pods, so whatever an InferenceService names reaches a pod: a Secret
named in ``spec.model.credentials``, ``spec.quantization.calibration.credentials``,
``spec.server.auth.bearerTokenSecretRef`` or ``spec.runtime.env[].valueFrom.secretKeyRef`` becomes an
environment variable (or the pull secret) of a container that runs ``spec.runtime.image``, and
``spec.serviceAccountName`` that ServiceAccount's token. A user who may create InferenceServices but
not Pods could read them through the pod. The cluster admin closes that with the operator's settings
``secret_references_allowed`` and ``service_account_references_allowed`` (chart values
``secretReferences.allowed``, ``serviceAccountReferences.allowed``): glob patterns of ``NAME`` or
``NAMESPACE/NAME``; ``*`` (the default) allows every one, an empty list none. An InferenceService that
names one outside them is refused (``Ready=False`` reason ``SecretNotAllowed`` or
``ServiceAccountNotAllowed``, naming the object and the field) before anything is applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from kubeinfer.operator import api, conditions
from kubeinfer.operator.status import ConditionState

#: The setting that allows every reference (and the default).
ALLOW_ALL = ("*",)


def matches(patterns: Sequence[str], namespace: str, name: str) -> bool:
    """Whether ``namespace``/``name`` matches one of ``patterns``: ``NAME`` globs match the name in any
    namespace, ``NAMESPACE/NAME`` globs both (``fnmatch``, case-sensitive: ``*``, ``?``, ``[...]``)."""
    for pattern in patterns:
        ns_pattern, sep, name_pattern = pattern.partition("/")
        if not sep and fnmatchcase(name, pattern):
            return True
        if sep and fnmatchcase(namespace, ns_pattern) and fnmatchcase(name, name_pattern):
            return True
    return False


def secret_references(spec: api.InferenceServiceSpec) -> list[tuple[str, str]]:
    """Every Secret the spec names, as ``(field, secret name)`` in field order."""
    refs: list[tuple[str, str]] = []
    if spec.model.credentials is not None:
        refs.append(("spec.model.credentials.secretName", spec.model.credentials.secret_name))
    calibration = spec.quantization.calibration
    if calibration is not None and calibration.credentials is not None:
        refs.append(
            ("spec.quantization.calibration.credentials.secretName", calibration.credentials.secret_name)
        )
    if spec.server.auth is not None:
        refs.append(
            ("spec.server.auth.bearerTokenSecretRef.name", spec.server.auth.bearer_token_secret_ref.name)
        )
    for i, var in enumerate(spec.runtime.env):
        ref = (var.value_from or {}).get("secretKeyRef")
        if isinstance(ref, dict):
            refs.append((f"spec.runtime.env[{i}].valueFrom.secretKeyRef.name", str(ref.get("name") or "")))
    return refs


@dataclass(frozen=True)
class ReferencePolicy:
    """The patterns of the Secrets and the ServiceAccounts InferenceServices may name (:func:`matches`)."""

    secrets: tuple[str, ...] = ALLOW_ALL
    service_accounts: tuple[str, ...] = ALLOW_ALL

    def describe(self) -> str:
        """The policy in words, for the operator's log at start."""

        def words(patterns: tuple[str, ...]) -> str:
            if "*" in patterns:
                return "any"
            return ", ".join(patterns) if patterns else "none"

        return f"Secrets: {words(self.secrets)}; ServiceAccounts: {words(self.service_accounts)}"

    def refusal(self, isvc: api.InferenceService) -> ConditionState | None:
        """``Ready=False`` naming the first Secret or ServiceAccount ``isvc`` may not name, and its field;
        ``None`` when it names none outside the policy."""
        for path, name in secret_references(isvc.spec):
            if not matches(self.secrets, isvc.namespace, name):
                return ConditionState(
                    "False",
                    conditions.SECRET_NOT_ALLOWED,
                    f'{path}: Secret "{name}" is not one InferenceServices may reference (the operator\'s '
                    f"secretReferences.allowed: {_shown(self.secrets)}); nothing was applied",
                )
        account = isvc.spec.service_account_name
        if account is not None and not matches(self.service_accounts, isvc.namespace, account):
            return ConditionState(
                "False",
                conditions.SERVICE_ACCOUNT_NOT_ALLOWED,
                f'spec.serviceAccountName: ServiceAccount "{account}" is not one InferenceServices may use '
                f"(the operator's serviceAccountReferences.allowed: {_shown(self.service_accounts)}); "
                "nothing was applied",
            )
        return None


def _shown(patterns: tuple[str, ...], limit: int = 300) -> str:
    text = ", ".join(patterns) or "none"
    return text if len(text) <= limit else text[: limit - 3] + "..."
