"""Studies: a preset's arms x seeds as jobs, the searches that tune an arm, the worker that runs
a tuned study's rounds, and the statistics that turn finished runs into verdicts on claims."""
