"""Where a run goes: the Ray session it joins or starts, the cluster's capacity (what is up, or the node
types an autoscaler can add), the resource plan with its reasons, and the scale-up around a fit."""
