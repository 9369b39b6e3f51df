"""`remedy serve`: the team's HTTP service, the one owner of a KB while it runs.

``create_app(kb_path)`` builds the FastAPI app; ``remedy serve`` hands it to uvicorn.
Tokens (:mod:`.tokens`) and jobs (:mod:`.jobs`) live in the KB's DuckDB file.
"""

from .app import create_app, remedy_version
from .jobs import JobRecord, JobRunner, JobState, JobStore
from .tokens import Role, TokenRecord, TokenStore

__all__ = [
    "create_app",
    "remedy_version",
    "Role",
    "TokenRecord",
    "TokenStore",
    "JobRecord",
    "JobRunner",
    "JobState",
    "JobStore",
]
