"""Test kit shared by tests and benchmarks: process launchers, the Kubernetes API emulator, model builders."""
