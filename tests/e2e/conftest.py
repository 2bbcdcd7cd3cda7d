"""The e2e tier: a real cluster (kind in .github/workflows/e2e.yaml) reached through the
current kubeconfig context, with the images built and loaded beforehand. Run it with

    pytest tests/e2e --e2e

(`--e2e` is registered in tests/conftest.py; without it these tests are deselected.)
"""
