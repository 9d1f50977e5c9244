# Experiment "multihead": non-identifiability (Prop. 7.1) and orthogonal subspaces (App. C)
# (src/attnquery/experiments/multihead.py).
FIGURES["multihead"] = ["multihead"]


rule plot_multihead:
    input:
        result_files("multihead"),
    output:
        pdf=report(
            "figures/multihead.pdf",
            caption="../report/multihead.rst",
            category="One-layer transformers and multi-head attention",
            labels={"figure": "multihead"},
        ),
        png="figures/multihead.png",
    params:
        figure="multihead",
        claims=claims_text("multihead"),
    log:
        "logs/figures/multihead.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"


# Experiment "multihead_generic": generic heads recovered from value queries, up to a
# permutation (src/attnquery/experiments/multihead_generic.py).
FIGURES["multihead_generic"] = ["multihead_generic"]
# Wall times are a figure of their own, so that multihead_generic stays byte-for-byte
# reproducible (make check-reproducible).
FIGURES["multihead_generic_time"] = ["multihead_generic"]


rule plot_multihead_generic:
    input:
        result_files("multihead_generic"),
    output:
        pdf=report(
            "figures/multihead_generic.pdf",
            caption="../report/multihead_generic.rst",
            category="One-layer transformers and multi-head attention",
            labels={"figure": "multihead_generic"},
        ),
        png="figures/multihead_generic.png",
    params:
        figure="multihead_generic",
        claims=claims_text("multihead_generic"),
    log:
        "logs/figures/multihead_generic.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"


rule plot_multihead_generic_time:
    input:
        result_files("multihead_generic"),
    output:
        pdf=report(
            "figures/multihead_generic_time.pdf",
            caption="../report/multihead_generic_time.rst",
            category="One-layer transformers and multi-head attention",
            labels={"figure": "multihead_generic_time"},
        ),
        png="figures/multihead_generic_time.png",
    params:
        figure="multihead_generic_time",
    log:
        "logs/figures/multihead_generic_time.log",
    conda:
        "../envs/attnquery.yaml"
    script:
        "../scripts/plot_figure.py"
