"""The run's settings: the composed config read once into a typed tree, each section checking itself."""
