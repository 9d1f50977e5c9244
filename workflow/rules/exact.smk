# Experiment "exact": Theorem 4.1 (see src/attnquery/experiments/exact.py).
FIGURES["exact_queries"] = ["exact"]


rule plot_exact_queries:
    input:
        result_files("exact"),
    output:
        pdf=report(
            "figures/exact_queries.pdf",
            caption="../report/exact_queries.rst",
            category="Exact recovery",
            labels={"figure": "exact_queries"},
        ),
        png="figures/exact_queries.png",
    params:
        figure="exact_queries",
        claims=claims_text("exact_queries"),
    log:
        "logs/figures/exact_queries.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"
