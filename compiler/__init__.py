"""Kiln's compiler core: tensor expressions, schedules, loop IR, lowering, code generation, toolchains.

It turns schedules into artifacts and never runs them; it imports nothing else of Kiln's.
"""
