"""Developer tools (``make run``); a package so ``bench`` can reuse the devstack helpers."""
