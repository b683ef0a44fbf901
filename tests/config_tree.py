"""Config trees for tests: keyword paths (`rollout__seed=3`) set into a nested dict."""

from __future__ import annotations


def set_paths(tree: dict, paths: dict) -> dict:
    """Set each `a__b__c=value` of `paths` at tree["a"]["b"]["c"] (made where missing); returns `tree`."""
    for key, value in paths.items():
        node = tree
        *parents, leaf = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree
