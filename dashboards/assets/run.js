/* The run page's timeline: the step axis (bottom) follows a zoom of the time axis. Plotly autoranges an axis over
   all its data, so after a time zoom the steps would keep the whole run's range; here the steps drawn inside the
   time range set it, and a reset (double-click) gives the axis back to autorange. */
window.dash_clientside = Object.assign({}, window.dash_clientside, {
  goodput: Object.assign({}, (window.dash_clientside || {}).goodput, {
    stepAxisFollowsTime: function (relayout, graphId) {
      var nothing = window.dash_clientside.no_update;
      if (!relayout) { return nothing; }
      var keys = Object.keys(relayout);
      var timeKeys = keys.filter(function (k) { return /^xaxis2?\./.test(k); });
      if (!timeKeys.length) { return nothing; }  // our own step-axis change, or a hover / legend event
      var holder = document.getElementById(graphId);
      var gd = holder && (holder.classList.contains("js-plotly-plot") ? holder
                                                                        : holder.querySelector(".js-plotly-plot"));
      if (!gd || !gd._fullLayout || !window.Plotly) { return nothing; }
      var reset = timeKeys.some(function (k) { return /autorange$/.test(k); });
      if (reset) {
        window.Plotly.relayout(gd, {"yaxis2.autorange": true});
        return "autorange";
      }
      var ax = gd._fullLayout.xaxis2;
      if (!ax || !ax.range) { return nothing; }
      var lo = ax.r2c(ax.range[0]), hi = ax.r2c(ax.range[1]);
      var min = Infinity, max = -Infinity;
      (gd.data || []).forEach(function (trace) {
        if (trace.yaxis !== "y2" || trace.fill === "toself" || !trace.x || !trace.y) { return; }
        for (var i = 0; i < trace.x.length; i++) {
          var t = ax.d2c(trace.x[i]);
          var y = Number(trace.y[i]);
          if (t >= lo && t <= hi && isFinite(y)) {
            if (y < min) { min = y; }
            if (y > max) { max = y; }
          }
        }
      });
      if (!isFinite(min)) { return nothing; }
      var pad = Math.max((max - min) * 0.06, 1);
      window.Plotly.relayout(gd, {"yaxis2.range": [Math.max(0, min - pad), max + pad]});
      return [min, max];
    }
  })
});
