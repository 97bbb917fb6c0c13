"""Rows and models in and out: datasets, built-in tasks, benchmarks, answer checking, JSONL records, model loading."""
