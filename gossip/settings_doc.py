"""``python -m gossip.settings_doc > docs/settings.md``: the settings table of the docs,
written from :data:`gossip.settings.SETTINGS` by :func:`gossip.settings.settings_markdown`."""

from __future__ import annotations

from gossip.settings import settings_markdown

if __name__ == "__main__":
    print(settings_markdown(), end="")
