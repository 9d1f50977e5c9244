# Experiment "transformer": one-layer transformers, Sec. 4.1 (src/attnquery/experiments/transformer.py).
FIGURES["transformer_recovery"] = ["transformer"]


rule plot_transformer_recovery:
    input:
        result_files("transformer"),
    output:
        pdf=report(
            "figures/transformer_recovery.pdf",
            caption="../report/transformer_recovery.rst",
            category="One-layer transformers and multi-head attention",
            labels={"figure": "transformer_recovery"},
        ),
        png="figures/transformer_recovery.png",
    params:
        figure="transformer_recovery",
        claims=claims_text("transformer_recovery"),
    log:
        "logs/figures/transformer_recovery.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"
