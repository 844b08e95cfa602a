"""Figures built from the tidy results tables (never from logs): Fig. 3 and Fig. 4 analogues."""
