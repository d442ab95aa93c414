"""The admin API's map of which worker holds which partition, as a StatefulSet's workers build it.

Each worker listens on 0.0.0.0 in a pod; the group learns its URL from the assignment metadata
(Faust's ``canonical_url``), and the partition assignor keys the changelog's distribution by it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from futures.worker.admin.views import AdminApi
from futures.worker.app import create_app
from futures.worker.config import WorkerConfig
from futures.worker.status import WorkerStatus

SERVICE = "timers-worker.delays.svc"


class Held:
    """The part of TimerStore the API reads: the partitions held here."""

    def __init__(self, partitions: list[int]) -> None:
        self.tables = {p: cast(Any, None) for p in partitions}

    def open_partitions(self) -> dict[int, Any]:
        return dict(self.tables)

    def owns(self, partition: int) -> bool:
        return partition in self.tables


def pod_config(tmp_path: Path, pod: str, advertise: bool) -> WorkerConfig:
    env = {"TIMERS_WEB_HOST": "0.0.0.0", "TIMERS_DATA_DIR": str(tmp_path / pod)}  # noqa: S104 - a pod's
    if advertise:
        env["TIMERS_ADVERTISED_URL"] = f"http://{pod}.{SERVICE}:6066"
    return WorkerConfig.from_env(env)


def elsewhere_seen_by_the_first(tmp_path: Path, advertise: bool) -> dict[str, list[int]]:
    configs = [pod_config(tmp_path, f"timers-worker-{i}", advertise) for i in (0, 1)]
    apps = [create_app(config, 4).app for config in configs]
    changelog = configs[0].changelog_topic
    # What the group leader sends every member: each member's URL (from its own metadata)
    # and the changelog partitions it was given.
    distribution = {
        str(apps[0].conf.canonical_url): {changelog: [0, 1]},
        str(apps[1].conf.canonical_url): {changelog: [2, 3]},
    }
    apps[0].assignor.changelog_distribution = distribution
    api = AdminApi(apps[0], configs[0], cast(Any, Held([0, 1])), WorkerStatus(), cast(Any, None))
    return api.holding().elsewhere_json()


def test_each_worker_names_the_pod_holding_the_other_partitions(tmp_path: Path) -> None:
    assert elsewhere_seen_by_the_first(tmp_path, advertise=True) == {
        f"http://timers-worker-1.{SERVICE}:6066": [2, 3],
    }


def test_without_an_advertised_url_the_bind_address_names_no_peer(tmp_path: Path) -> None:
    # Both members say http://0.0.0.0:6066: the map cannot tell them apart, so it is empty.
    assert elsewhere_seen_by_the_first(tmp_path, advertise=False) == {}
