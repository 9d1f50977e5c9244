# Experiments "noise" and "rounding": Theorem 6.1 under approximate answers, and output rounding
# as a defence (see src/attnquery/experiments/noise.py).
FIGURES["noise_scaling"] = ["noise"]
FIGURES["defence_rounding"] = ["rounding"]


rule plot_noise_scaling:
    input:
        result_files("noise"),
    output:
        pdf=report(
            "figures/noise_scaling.pdf",
            caption="../report/noise_scaling.rst",
            category="Noisy and sign-only oracles",
            labels={"figure": "noise_scaling"},
        ),
        png="figures/noise_scaling.png",
    params:
        figure="noise_scaling",
        claims=claims_text("noise_scaling"),
    log:
        "logs/figures/noise_scaling.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"


rule plot_defence_rounding:
    input:
        result_files("rounding"),
    output:
        pdf=report(
            "figures/defence_rounding.pdf",
            caption="../report/defence_rounding.rst",
            category="Noisy and sign-only oracles",
            labels={"figure": "defence_rounding"},
        ),
        png="figures/defence_rounding.png",
    params:
        figure="defence_rounding",
        claims=claims_text("defence_rounding"),
    log:
        "logs/figures/defence_rounding.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"
