"""The Ray Serve entry points under their short name (``pip install 'anydraft[ray]'``):
``anydraft.deploy.app(**options)`` returns the bound application, and
``serve run anydraft.deploy:app_builder target=... replicas=2`` (or a Ray Serve config file's
``import_path``) builds it from one dict of options. They live in server/deploy.py."""

from .server.deploy import app, app_builder

__all__ = ["app", "app_builder"]
