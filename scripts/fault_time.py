"""Print how long the fault tests (tests/faults) took in a pytest JUnit report.

Usage: ``python scripts/fault_time.py var/ci-junit.xml``. Prints one line:
the number of fault tests, their summed run time in seconds (what they would
take on one worker) and the slowest. Issue 17 bounds them to 5 minutes
together; this is how `.ci/run` shows it. Exit status 0 (a report, not a check).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def main(path: str) -> None:
    cases = [c for c in ET.parse(path).iter("testcase") if c.get("classname", "").startswith("tests.faults.")]
    if not cases:
        print("FAULT suite: no fault tests in the report")
        return
    times = sorted(((float(c.get("time", 0)), c.get("name", "?")) for c in cases), reverse=True)
    total = sum(t for t, _ in times)
    slowest = ", ".join(f"{name} {t:.0f} s" for t, name in times[:3])
    print(
        f"FAULT suite: {len(cases)} tests, {total:.0f} s summed over workers ({total / 60:.1f} min; slowest: {slowest})"
    )


if __name__ == "__main__":
    main(sys.argv[1])
