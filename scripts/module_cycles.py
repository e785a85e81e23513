#!/usr/bin/env python3
"""Cycles between src/'s top-level modules, from the `crate::` paths each module's files name
(comment lines left out). Prints each cycle with the files behind each edge; exits 1 if any.

    python3 scripts/module_cycles.py
"""
import collections
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def modules():
    found = {}
    for entry in os.listdir(ROOT):
        path = os.path.join(ROOT, entry)
        if entry in ("lib.rs", "main.rs"):
            continue
        if os.path.isdir(path):
            files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".rs")]
            found[entry] = files
        elif entry.endswith(".rs"):
            found[entry[:-3]] = [path]
    return found


def edges(found):
    graph, why = collections.defaultdict(set), collections.defaultdict(set)
    for module, files in found.items():
        for file in files:
            with open(file) as f:
                text = "\n".join(l for l in f.read().split("\n") if not l.strip().startswith("//"))
            named = re.findall(r"crate::(\w+)", text)
            for group in re.findall(r"crate::\{([^}]*)\}", text, re.S):
                named += re.findall(r"(?:^|[,{\s])(\w+)", group)
            for target in named:
                if target in found and target != module:
                    graph[module].add(target)
                    why[(module, target)].add(os.path.relpath(file, ROOT))
    return graph, why


def cycles(found, graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(found):
        if v not in index:
            visit(v)
    return out


def main():
    found = modules()
    graph, why = edges(found)
    found_cycles = cycles(found, graph)
    for component in found_cycles:
        print("cycle:", " ".join(component))
        for a in component:
            for b in sorted(graph[a] & set(component)):
                print(f"  {a} -> {b}: {', '.join(sorted(why[(a, b)]))}")
    if not found_cycles:
        print(f"no cycle between the {len(found)} top-level modules of src/")
    return 1 if found_cycles else 0


if __name__ == "__main__":
    sys.exit(main())
