"""Strict check of a Prometheus text exposition read from stdin.

Parses it with prometheus_client's text-format parser (any malformed
line raises), then requires every family to carry a TYPE other than
"unknown" and a non-empty HELP. Prints the samples as JSON lines:
{"name": ..., "labels": {...}, "value": ..., "type": ...}. Exits 1 with a
message on the first problem.
"""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main() -> int:
    text = sys.stdin.read()
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and friends
        print(f"parse error: {e!r}", file=sys.stderr)
        return 1
    if not families:
        print("no metric families", file=sys.stderr)
        return 1
    for fam in families:
        if fam.type == "unknown":
            print(f"{fam.name}: no TYPE line", file=sys.stderr)
            return 1
        if not fam.documentation:
            print(f"{fam.name}: no HELP text", file=sys.stderr)
            return 1
        for s in fam.samples:
            print(json.dumps({"name": s.name, "labels": s.labels,
                              "value": s.value, "type": fam.type}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
