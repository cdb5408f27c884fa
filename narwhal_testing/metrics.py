"""Prometheus text → samples keyed ``name{label="value",...}``, read with ``prometheus_client``.

Label order is not part of the exposition format (``prometheus_client`` writes labels sorted), so
lookups accept the labels in any order: ``s['m{iid="e1",cause="x"}']`` finds ``m{cause="x",iid="e1"}``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.parser import parse_labels, text_string_to_metric_families


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def canonical(key: str) -> str:
    """``name{b="2",a="1"}`` → ``name{a="1",b="2"}`` (keys without labels are unchanged)."""
    name, brace, rest = key.partition("{")
    if not brace:
        return key
    return sample_key(name, parse_labels(rest.removesuffix("}")))


class Samples(Mapping[str, float]):
    def __init__(self, values: dict[str, float]) -> None:
        self._values = values

    def __getitem__(self, key: str) -> float:
        return self._values[canonical(key)]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and canonical(key) in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def parse_samples(text: str) -> Samples:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[sample_key(s.name, s.labels)] = float(s.value)
    return Samples(out)
