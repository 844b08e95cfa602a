"""Re-export of :mod:`system.assignment` (the assignment lives beside the cluster)."""

from system.assignment import Assignment, identity_assignment, random_assignment

__all__ = ["Assignment", "identity_assignment", "random_assignment"]
