"""The oscillator: once a second, a tick to every partition of the ``oscillator`` topic.

A tick for second ``s`` in partition ``p`` tells the worker owning ``p`` that its
clock has reached ``s``; the worker then fires every timer of ``p`` due by ``s``.
"""
