"""server.yaml's ``placement.plugins``: the dotted paths of placement plugins, checked (not imported).

Read by the server.yaml checks (facility.services) and by each process as it starts (placement.apps),
which is when plugins load: code comes from the server's own file, never from a body sent to the API.
"""

from __future__ import annotations

import re

from llmgw.yamldoc import Document, load_documents

PLUGIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?")
MAX_PLUGINS = 50


def plugin_names(doc: Document) -> list[str]:
    """The document's ``placement.plugins``, each a dotted path, or InvalidInput naming line and field."""
    from agents.node.protocol import value_shown

    block = doc.data.get("placement") or {}
    if not isinstance(block, dict):
        raise doc.error(("placement",), "must be a mapping with plugins: [dotted.path, …]")
    doc.check_keys(("placement",), block, ("plugins",), "placement")
    names = block.get("plugins") or []
    if not isinstance(names, list) or len(names) > MAX_PLUGINS:
        raise doc.error(("placement", "plugins"), f"a list of at most {MAX_PLUGINS} dotted paths")
    for i, name in enumerate(names):
        if not isinstance(name, str) or len(name) > 200 or not PLUGIN_NAME.fullmatch(name):
            raise doc.error(("placement", "plugins", i), f"{value_shown(name)} is not a dotted path (pkg.module)")
    return names


def plugins_configured(text: str, filename: str) -> list[str]:
    """The plugins a server.yaml names (placement.plugins), checked; [] without any."""
    docs = load_documents(text, filename)
    if not docs or not isinstance(docs[0].data, dict) or "placement" not in docs[0].data:
        return []
    return plugin_names(docs[0])
