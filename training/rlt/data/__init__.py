"""Rows in and out: datasets, built-in tasks, benchmarks, answer checking, JSONL records."""
