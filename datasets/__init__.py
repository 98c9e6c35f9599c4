"""Shipped data: built-in workloads (workloads/*.yaml) and SoftwareDev prompts."""
