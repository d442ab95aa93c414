"""Ingress: what a request record means, for the worker and for the Spark jobs.

Pure parsers, no Kafka and no table: :func:`futures.ingress.requests.parse_record`
turns one record of any request topic into schedules, cancels and rejections
with their reasons, under the :class:`futures.ingress.limits.ParseLimits` it is
given. One module per format (:mod:`native`, :mod:`etf1`, :mod:`countdown`);
:mod:`base` holds the checks every timer passes, whatever its format.
"""
