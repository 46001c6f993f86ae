"""``kubectl get kisvc`` on a real API server with the generated CRD: P99 reads as a duration (the
status field ``observed.p99``), like MAX-QUEUE-DELAY beside it."""

from __future__ import annotations

import json

import yaml

from tests.integration.operator.test_operator_validation import BASE, _merge
from tests.support.cluster import Cluster


def test_kubectl_get_shows_p99_as_a_duration(cluster: Cluster, crds: None, namespace: str) -> None:
    manifest = _merge(BASE, {"metadata": {"name": "columns"}})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    status = {"status": {"maxQueueDelay": "15ms", "observed": {"p99": "23.4ms", "p99Seconds": 0.023353}}}
    cluster.kubectl(
        "patch",
        "kisvc",
        "columns",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    header, row = cluster.kubectl("get", "kisvc", "columns", "-n", namespace).stdout.strip().splitlines()
    # kubectl aligns the columns: read each cell below its heading (Ready and Replicas are empty here)
    p99, timeout, age = (header.index(h) for h in ("P99", "MAX-QUEUE-DELAY", "AGE"))
    assert (row[p99:timeout].strip(), row[timeout:age].strip()) == ("23.4ms", "15ms"), (header, row)
