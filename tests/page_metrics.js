// What tests/test_pages_browser.py counts on one page, as the browser laid it out.
// Evaluated in the page (an expression: its value goes back to the test as JSON).
(() => {
  const typeset = document.querySelector(".md-content .md-typeset");
  if (!typeset) return {blocks: 0, scrolling: [], small: [], split: [], tables: [], clipped: [], figures: [],
                        reference: null, column: 0, window: window.innerWidth};
  // The body's code font size: what a plain code block written in the page gets.
  const probe = document.createElement("div");
  probe.className = "highlight";
  probe.innerHTML = "<pre><code>probe</code></pre>";
  typeset.appendChild(probe);
  const reference = parseFloat(getComputedStyle(probe.querySelector("code")).fontSize);
  probe.remove();
  const text = (el) => el.textContent.split("\n").find((line) => line.trim()) || "";
  // A block scrolls sideways when its scroll box (Material makes it the <code> inside <pre>)
  // holds more than it shows.
  const blocks = [...typeset.querySelectorAll("pre")];
  const scrolling = [];
  for (const pre of blocks) {
    for (const box of [pre, pre.querySelector(":scope > code")].filter(Boolean)) {
      if (box.scrollWidth > box.clientWidth + 1) {
        scrolling.push({over: box.scrollWidth - box.clientWidth, first: text(box).slice(0, 70)});
        break;
      }
    }
  }
  // Output blocks (class no-copy, see docs/hooks/page_text.py) set smaller than code.
  const small = [];
  for (const pre of typeset.querySelectorAll(".no-copy pre")) {
    const size = parseFloat(getComputedStyle(pre.querySelector("code") || pre).fontSize);
    if (size < reference - 0.01) small.push({size, first: text(pre).slice(0, 70)});
  }
  // A table cell splits a word when one word lies on two lines. In code (a name, a flag) a
  // word runs from blank to blank; in prose a line may also end after a hyphen, as in print.
  const split = [];
  for (const cell of typeset.querySelectorAll("td, th")) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const words = node.parentElement.closest("code") ? /\S+/g : /[^\s-]+-?/g;
      for (const word of node.data.matchAll(words)) {
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        const tops = new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
        if (tops.size > 1) split.push(word[0]);
      }
    }
  }
  // A table wider than the column scrolls too (Material wraps each in a scrolling box).
  const tables = [...typeset.querySelectorAll(".md-typeset__scrollwrap")]
    .filter((box) => box.scrollWidth > box.clientWidth + 1)
    .map((box) => ({over: box.scrollWidth - box.clientWidth, first: text(box).slice(0, 70)}));
  // A picture's text that runs past the picture's edge is cut off there (svg.text_width guesses
  // widths; a bold face runs wider than it guesses).
  const clipped = [];
  for (const svg of typeset.querySelectorAll("figure svg")) {
    const edge = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll("text")) {
      const r = t.getBoundingClientRect();
      if (r.width > 0 && (r.right > edge.right + 0.5 || r.left < edge.left - 0.5)) {
        clipped.push({over: Math.round(Math.max(r.right - edge.right, edge.left - r.left)), first: t.textContent.slice(0, 70)});
      }
    }
  }
  // Every picture (an SVG drawn by minitron/cli/views/svg*.py or docs/examples: role="img"),
  // as the reader sees it: its width against the width its block leaves it, its smallest text
  // in screen px (font size times the picture's scale), and the texts whose boxes overlap.
  const figures = [];
  const pictures = new Set([...typeset.querySelectorAll("figure svg, svg[role=img]")]
    .filter((svg) => !svg.parentElement.closest("svg")));
  for (const svg of pictures) {
    const box = svg.getBoundingClientRect();
    const holder = svg.closest("figure") ? svg.closest("figure").parentElement : svg.parentElement;
    const style = getComputedStyle(holder);
    const room = holder.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const scale = svg.getScreenCTM() ? svg.getScreenCTM().a : 1;
    const texts = [...svg.querySelectorAll("text")].filter((t) => t.textContent.trim())
      .map((t) => ({t, r: t.getBoundingClientRect(), px: parseFloat(getComputedStyle(t).fontSize) * scale}))
      .filter(({r}) => r.width > 0);
    let smallest = {px: Infinity, text: ""};
    for (const {t, px} of texts) if (px < smallest.px) smallest = {px, text: t.textContent.slice(0, 40)};
    // Two texts touch when their boxes share any area (a glyph's box is a little taller than
    // its ink, about 1.17 em of a monospace face, so lines set svg.LINE = 1.3 em apart share none).
    const overlaps = [];
    const byLeft = texts.slice().sort((a, b) => a.r.left - b.r.left);
    for (let i = 0; i < byLeft.length; i++) {
      for (let j = i + 1; j < byLeft.length && byLeft[j].r.left < byLeft[i].r.right; j++) {
        const a = byLeft[i].r, b = byLeft[j].r;
        const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
        const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
        if (w > 0 && h > 0) overlaps.push([byLeft[i].t.textContent.slice(0, 30), byLeft[j].t.textContent.slice(0, 30)]);
      }
    }
    figures.push({label: (svg.getAttribute("aria-label") || "").slice(0, 70), width: Math.round(box.width),
                  room: Math.round(room), smallest: Math.round(smallest.px * 10) / 10, smallestText: smallest.text,
                  overlaps});
  }
  return {blocks: blocks.length, scrolling, small, split, tables, clipped, reference, figures,
          column: typeset.clientWidth, window: window.innerWidth};
})()
