"""``import metadef_benchmark as mb``: the benchmark API (:mod:`metadef.benchmark`) under the
top-level name that users' notes already import.

Example:
    >>> import metadef_benchmark as mb, metadef.benchmark
    >>> mb.TestScenario is metadef.benchmark.TestScenario, mb.Metrics is metadef.benchmark.Metrics
    (True, True)
"""

from metadef.benchmark import Metrics, TestScenario

__all__ = ["Metrics", "TestScenario"]
