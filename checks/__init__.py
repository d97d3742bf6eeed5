"""Keystone's check engine: spec loading, check types, scoring and reporters. No Django here.

Import what you need from its modules (checks.engine, checks.scoring, ...): this package
imports nothing itself, so a command that needs one module does not pay for the rest.
"""
