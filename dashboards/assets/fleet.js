/* The fleet page's filters in the address: written with history.replaceState, so the page is not drawn again and
   a reload (or a shared link) opens it with the same filters (dashboards/pages/fleet.py reads them back). */
window.dash_clientside = Object.assign({}, window.dash_clientside, {
  goodput: Object.assign({}, (window.dash_clientside || {}).goodput, {
    fleetFiltersToUrl: function (status, range, from, to, run, projects, group, sort, size, page, compare) {
      var params = new URLSearchParams();
      if (status) { params.set("status", status); }
      if (range && range !== "all") { params.set("range", range); }
      if (range === "custom" && from) { params.set("from", from); }
      if (range === "custom" && to) { params.set("to", to); }
      if (run) { params.set("run", run); }
      (projects || []).forEach(function (p) { params.append("project", p); });
      if (group && group !== "run") { params.set("group", group); }
      if (sort && sort.key && !(sort.key === "wasted" && sort.descending)) {
        params.set("sort", sort.key);
        params.set("order", sort.descending ? "desc" : "asc");
      }
      if (page && page > 1) { params.set("page", String(page)); }
      if (size && size !== 25) { params.set("size", String(size)); }
      (compare || []).forEach(function (c) { params.append("compare", c); });
      var query = params.toString();
      var url = window.location.pathname + (query ? "?" + query : "") + window.location.hash;
      if (url !== window.location.pathname + window.location.search + window.location.hash) {
        window.history.replaceState(window.history.state, "", url);
      }
      return query;
    }
  })
});
