"""Static files addressed by their content: ``{% static 'css/facility.css' %}`` is
``/static/css/facility.3f2a9c1b7e4d.css``, served with ``Cache-Control: immutable`` for a year, so a browser
asks for each file once and a new release's files are new addresses.

Django's manifest storage does the same from ``collectstatic``'s output; llmgw serves its files straight from
the source folders (``make demo``, tests and the deployments run no ``collectstatic``), so the hash is worked
out here from the file the finders find (once per file and modification time) and the middleware maps the
hashed address back to that file. The plain address still works (a minute's cache, as before).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from functools import lru_cache

from django.contrib.staticfiles import finders
from servestatic.middleware import ServeStaticMiddleware
from servestatic.storage import CompressedStaticFilesStorage

# `name.0123456789ab.ext`: the hash Django's manifest storage writes, 12 hex digits before the extension.
HASHED = re.compile(r"^(?P<root>.+)\.(?P<hash>[0-9a-f]{12})(?P<ext>\.[A-Za-z0-9]+)$")


@lru_cache(maxsize=4096)
def _digest(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as source:
        return hashlib.md5(source.read(), usedforsecurity=False).hexdigest()[:12]


def hashed_name(name: str) -> str | None:
    """`name` with its content's hash (``css/facility.3f2a9c1b7e4d.css``); None for a file no finder has."""
    path = finders.find(name)
    if not path or isinstance(path, list):
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    root, ext = os.path.splitext(name)
    return f"{root}.{_digest(path, stat.st_mtime_ns, stat.st_size)}{ext}"


class ContentHashedStaticFilesStorage(CompressedStaticFilesStorage):
    """The addresses `{% static %}` writes carry the file's content hash (files the finders do not know,
    such as ones only in STATIC_ROOT, keep their plain names)."""

    def url(self, name: str | None) -> str:
        if name:
            clean = name.split("?", 1)[0].split("#", 1)[0]
            hashed = hashed_name(clean)
            if hashed is not None:
                name = hashed + name[len(clean):]
        return super().url(name)


class ContentHashedServeStaticMiddleware(ServeStaticMiddleware):
    """ServeStatic that also answers a file's hashed address (ContentHashedStaticFilesStorage's) with the
    file, marked immutable."""

    def add_files_from_finders(self) -> None:
        super().add_files_from_finders()
        for url in list(self.files):
            if not url.startswith(self.static_prefix):
                continue
            name = url[len(self.static_prefix):]
            hashed = hashed_name(name)
            path = finders.find(name)
            if hashed is not None and hashed != name and path and not isinstance(path, list):
                self.add_file_to_dictionary(f"{self.static_prefix}{hashed}", path)

    def candidate_paths_for_url(self, url: str) -> Iterator[str]:
        # Found at the time of the request (autorefresh, in DEBUG): a hashed address is its file while the
        # hash is still the file's.
        yield from super().candidate_paths_for_url(url)
        if url.startswith(self.static_prefix):
            name = url[len(self.static_prefix):]
            found = HASHED.match(name)
            if found:
                plain = found["root"] + found["ext"]
                if hashed_name(plain) == name:
                    path = finders.find(plain)
                    if path and not isinstance(path, list):
                        yield path

    def immutable_file_test(self, path: str, url: str) -> bool:
        if not url.startswith(self.static_prefix):
            return False
        found = HASHED.match(url[len(self.static_prefix):])
        return bool(found) and hashed_name(found["root"] + found["ext"]) == url[len(self.static_prefix):]
