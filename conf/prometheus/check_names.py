#!/usr/bin/env python3
"""Checks that the alerting rules and the Grafana dashboard use only metric
names the host renders.

    python3 conf/prometheus/check_names.py <repo-root>

The known names are read from the host's sources, so no list is kept by hand:
every string literal starting "idemsink_ in core/metrics/metrics.h (the
lists that declare each series once), core/metrics/metrics.cc,
core/kafka/*.cc and core/admin/*.cc. The names used are every idemsink_* name
in the PromQL of conf/prometheus/alerts.yml (expr), of
conf/prometheus/alerts_test.yml (series, expr) and of conf/grafana/idemsink.json
(targets' expr, template variables' query and definition); a histogram's
_bucket, _sum and _count series count as its family's name.

Exit 0 when every name used is known, 1 naming each unknown one (and where
it is used), 2 on bad usage or a file missing. Python 3 standard library only.
"""
import glob
import json
import os
import re
import sys

SOURCES = ["core/metrics/metrics.h", "core/metrics/metrics.cc", "core/kafka/*.cc", "core/admin/*.cc"]
RULES = "conf/prometheus/alerts.yml"
RULE_TESTS = "conf/prometheus/alerts_test.yml"
DASHBOARD = "conf/grafana/idemsink.json"

DEFINED = re.compile(r'"(idemsink_[a-z0-9_]+)')
USED = re.compile(r"\b(idemsink_[a-z0-9_]+)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def known_names(root):
    names = set()
    files = []
    for pattern in SOURCES:
        files += sorted(glob.glob(os.path.join(root, pattern)))
    if not files:
        print("check_names: no sources under %s (%s): is it the repository's root?" % (root, ", ".join(SOURCES)),
              file=sys.stderr)
        sys.exit(2)
    for path in files:
        with open(path, encoding="utf-8") as f:
            names.update(DEFINED.findall(f.read()))
    return names


def yaml_values(path, keys):
    """The values of `key:` lines in a YAML file, block scalars (| or >) included.

    Enough for Prometheus rule and test files; not a YAML parser."""
    key_line = re.compile(r"^(\s*)(?:-\s+)?(%s):\s*(.*)$" % "|".join(map(re.escape, keys)))
    values = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    i = 0
    while i < len(lines):
        m = key_line.match(lines[i])
        i += 1
        if not m:
            continue
        indent, value = len(m.group(1)), m.group(3).strip()
        if value[:1] in ("|", ">"):
            block = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                block.append(lines[i])
                i += 1
            value = "\n".join(block)
        values.append(value)
    return values


def dashboard_queries(path):
    with open(path, encoding="utf-8") as f:
        dashboard = json.load(f)
    queries = []

    def walk(node, key=None):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, str) and key in ("expr", "query", "definition"):
            queries.append(node)

    walk(dashboard)
    return queries


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print("usage: python3 conf/prometheus/check_names.py <repo-root>", file=sys.stderr)
        return 2
    root = argv[1]
    known = known_names(root)
    used = {}  # name -> files
    inputs = [
        (RULES, lambda p: yaml_values(p, ["expr"])),
        (RULE_TESTS, lambda p: yaml_values(p, ["series", "expr"])),
        (DASHBOARD, dashboard_queries),
    ]
    for rel, extract in inputs:
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            print("check_names: %s is missing" % rel, file=sys.stderr)
            return 2
        for query in extract(path):
            for name in USED.findall(query):
                used.setdefault(name, set()).add(rel)

    def is_known(name):
        if name in known:
            return True
        return any(name.endswith(s) and name[: -len(s)] in known for s in HISTOGRAM_SUFFIXES)

    unknown = sorted(n for n in used if not is_known(n))
    for name in unknown:
        print("unknown metric %s (used in %s)" % (name, ", ".join(sorted(used[name]))))
    if unknown:
        print("check_names: %d of %d metric names used are not rendered by %s" % (len(unknown), len(used), ", ".join(SOURCES)))
        return 1
    print("check_names: all %d metric names used are rendered by the host (%d known)" % (len(used), len(known)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
