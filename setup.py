"""The one compiled part: the relay's per-read loop (router/serving/_relay.c). Optional — where it
cannot be built (no C compiler), the install goes on and the router uses the same loop in Python
(router/serving/fastrelay.py) and says so at start-up."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("router.serving._relay", ["router/serving/_relay.c"], optional=True)])
