"""Admin API and web page of the futures worker: see, search, cancel and reschedule timers.

``views.register_admin`` adds them to the worker's Faust web server; ``queries``
answers reads with bounded range scans; ``actions`` sends cancels and reschedules
through the client library, like any user; ``static/`` is the page (plain HTML,
CSS and JS, no build step).
"""
