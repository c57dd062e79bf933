"""Renderers: turn result objects into text, JSON, CSV, HTML or images. Nothing here computes."""
