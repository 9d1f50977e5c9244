# Experiment "membership": recovery from membership queries, Appendix B (see
# src/attnquery/experiments/membership.py).
FIGURES["membership_cost"] = ["membership"]


rule plot_membership_cost:
    input:
        result_files("membership"),
    output:
        pdf=report(
            "figures/membership_cost.pdf",
            caption="../report/membership_cost.rst",
            category="Noisy and sign-only oracles",
            labels={"figure": "membership_cost"},
        ),
        png="figures/membership_cost.png",
    params:
        figure="membership_cost",
        claims=claims_text("membership_cost"),
    log:
        "logs/figures/membership_cost.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"
