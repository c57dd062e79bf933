"""Compiled code shared by the capture and the comparison: ``fused_pass.c`` (a pair's one-pass comparison and a
tensor's one-pass statistics), built by the machine's C compiler and loaded by :mod:`.fused_c`."""
