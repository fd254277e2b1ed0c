"""The stores: MLflow tracking, the guards and lock around opening a store, and masking of
credentials in store URLs."""
