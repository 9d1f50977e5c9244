# Experiments "lowrank_phase" and "lowrank_scale": low-rank heads, Section 5
# (see src/attnquery/experiments/lowrank.py and src/attnquery/figures/lowrank.py).
FIGURES["lowrank_phase"] = ["lowrank_phase"]
# The query and time figures need the sketch runs; the nuclear-norm rows are drawn when
# lowrank_phase is enabled too.
FIGURES["lowrank_queries"] = ["lowrank_scale"]
FIGURES["lowrank_time"] = ["lowrank_scale"]


rule plot_lowrank_phase:
    input:
        result_files("lowrank_phase"),
    output:
        pdf=report(
            "figures/lowrank_phase.pdf",
            caption="../report/lowrank_phase.rst",
            category="Low-rank recovery",
            labels={"figure": "lowrank_phase"},
        ),
        png="figures/lowrank_phase.png",
    params:
        figure="lowrank_phase",
        claims=claims_text("lowrank_phase"),
    log:
        "logs/figures/lowrank_phase.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"


rule plot_lowrank_queries:
    input:
        result_files("lowrank_phase", "lowrank_scale"),
    output:
        pdf=report(
            "figures/lowrank_queries.pdf",
            caption="../report/lowrank_queries.rst",
            category="Low-rank recovery",
            labels={"figure": "lowrank_queries"},
        ),
        png="figures/lowrank_queries.png",
    params:
        figure="lowrank_queries",
        claims=claims_text("lowrank_queries"),
    log:
        "logs/figures/lowrank_queries.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"


rule plot_lowrank_time:
    input:
        result_files("lowrank_phase", "lowrank_scale"),
    output:
        pdf=report(
            "figures/lowrank_time.pdf",
            caption="../report/lowrank_time.rst",
            category="Low-rank recovery",
            labels={"figure": "lowrank_time"},
        ),
        png="figures/lowrank_time.png",
    params:
        figure="lowrank_time",
        claims=claims_text("lowrank_time"),
    log:
        "logs/figures/lowrank_time.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"
