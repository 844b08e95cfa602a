"""Importers and models for other projects' published measurements (``sailor``: Sailor's
validation set, Strati et al., SOSP 2025)."""
