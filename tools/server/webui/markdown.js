// Markdown for the chat's replies, written for this page: the subset models write (paragraphs,
// headings, fenced code with a language, lists, block quotes, tables, rules; inline code, bold,
// italics, strike-through, links). It builds DOM nodes and sets only textContent, never innerHTML, so
// nothing in a reply can become markup or script; links are kept only for http(s) and mailto.
// A reply still streaming renders the same way: an unclosed fence is a code block up to the end.
"use strict";

const OspreyMarkdown = (() => {
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // ---- inline ------------------------------------------------------------------------------
  // Each rule: a regex (global, tried from the current position) and what to make of a match.
  // The earliest match wins; among matches at one place, the first rule listed.
  const INLINE = [
    { re: /`([^`\n]+)`/g, make: (m) => el("code", null, m[1]) },
    { re: /\*\*(?=\S)([^]*?\S)\*\*/g, make: (m) => wrap("strong", m[1]) },
    { re: /__(?=\S)([^]*?\S)__(?!\w)/g, make: (m) => wrap("strong", m[1]) },
    { re: /\*(?=[^\s*])([^*\n]*?[^\s*])\*/g, make: (m) => wrap("em", m[1]) },
    { re: /(?<![\w\\])_(?=[^\s_])([^_\n]*?[^\s_])_(?!\w)/g, make: (m) => wrap("em", m[1]) },
    { re: /~~(?=\S)([^~\n]*?\S)~~/g, make: (m) => wrap("del", m[1]) },
    // a destination or bare URL may hold balanced parentheses, one level (Wikipedia's Foo_(bar)); a
    // bare URL's trailing punctuation and an unbalanced ")" stay outside it, as GitHub's autolinks
    // (link text at most 1,000 characters: unbounded, a line of "[" was quadratic in this one search)
    { re: /\[([^\]\n]{1,1000})\]\(\s*((?:[^()\s]|\([^()\s]*\))+)\s*\)/g, make: (m) => link(m[1], m[2]) },
    { re: /\bhttps?:\/\/(?:[^\s<>()]|\([^\s<>()[\]`]*\))*(?:[^\s<>().,;:!?'"\]]|\([^\s<>()[\]`]*\))/g, make: (m) => link(null, m[0]) },
  ];

  function wrap(tag, text) {
    const e = el(tag);
    inline(text, e);
    return e;
  }

  function link(text, href) {
    if (!/^(https?:|mailto:)/i.test(href)) return document.createTextNode(text === null ? href : "[" + text + "](" + href + ")");
    const a = el("a");
    a.href = href;
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    if (text === null) a.textContent = href;
    else inline(text, a);
    return a;
  }

  // Appends text's inline markup to parent as nodes. Each rule's leftmost match from pos is kept until
  // pos passes its start: no match of that rule starts between the old pos and it, so none between the
  // new pos and it either (and a rule with none from pos has none later). Searching every rule again
  // after each match made a line of many short matches and one unclosed "**" cubic (a 32 KB line of
  // "**a *b* " took 47 s; a fresh-user review found it).
  function inline(text, parent) {
    if (text.length > 65536) { // a line this long shows as it is (a rule's single search is quadratic in it)
      parent.appendChild(document.createTextNode(text));
      return;
    }
    let pos = 0;
    const next = INLINE.map(() => undefined); // per rule: its cached match, null when it has none left
    while (pos < text.length) {
      let best = null, bestRule = null;
      for (let r = 0; r < INLINE.length; r++) {
        let m = next[r];
        if (m === undefined || (m !== null && m.index < pos)) {
          INLINE[r].re.lastIndex = pos;
          m = next[r] = INLINE[r].re.exec(text);
        }
        if (m && (!best || m.index < best.index)) { best = m; bestRule = INLINE[r]; }
      }
      if (!best) break;
      if (best.index > pos) parent.appendChild(document.createTextNode(text.slice(pos, best.index)));
      parent.appendChild(bestRule.make(best));
      pos = best.index + best[0].length;
    }
    if (pos < text.length) parent.appendChild(document.createTextNode(text.slice(pos)));
  }

  // ---- code blocks -------------------------------------------------------------------------
  // A light highlighter for any language: comments, strings, numbers and a shared keyword list.
  const KEYWORDS = new Set(("if else elif for while do return break continue switch case default try catch finally " +
    "throw class struct enum union typedef def function fn let const var static void int char float double long " +
    "unsigned bool true false null None True False nil import from export as in of new delete this self pub use mod " +
    "impl match async await yield lambda with and or not is package func go defer interface type extends implements " +
    "public private protected sizeof include define select where insert update create table").split(" "));
  const TOKEN = /(\/\/[^\n]*|\/\*[^]*?(?:\*\/|$)|#(?!include|define)[^\n]*|--[^\n]*)|("(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|`[^`]*`?)|(\b\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?\b|\b0x[0-9a-fA-F]+\b)|([A-Za-z_#][\w]*)/g;
  const HASH_COMMENTS = /^(python|py|sh|bash|shell|zsh|ruby|rb|perl|r|yaml|yml|toml|make|makefile|dockerfile|cmake|ini|conf)$/i;
  const DASH_COMMENTS = /^(sql|lua|haskell|hs)$/i;

  function highlight(code, lang, parent) {
    if (code.length > 100000) { parent.textContent = code; return; }
    let pos = 0, m;
    TOKEN.lastIndex = 0;
    while ((m = TOKEN.exec(code))) {
      let cls = null;
      if (m[1] !== undefined) {
        const c = m[1];
        if (c[0] === "#" && !HASH_COMMENTS.test(lang)) { TOKEN.lastIndex = m.index + 1; continue; }
        if (c.startsWith("--") && !DASH_COMMENTS.test(lang)) { TOKEN.lastIndex = m.index + 2; continue; }
        cls = "tok-c";
      } else if (m[2] !== undefined) cls = "tok-s";
      else if (m[3] !== undefined) cls = "tok-n";
      else if (KEYWORDS.has(m[4]) || m[4] === "#include" || m[4] === "#define") cls = "tok-k";
      if (!cls) continue;
      if (m.index > pos) parent.appendChild(document.createTextNode(code.slice(pos, m.index)));
      parent.appendChild(el("span", cls, m[0]));
      pos = m.index + m[0].length;
    }
    if (pos < code.length) parent.appendChild(document.createTextNode(code.slice(pos)));
  }

  function codeBlock(code, lang) {
    const box = el("div", "codeblock");
    const head = el("div", "head");
    head.appendChild(el("span", null, lang || "text"));
    const copy = el("button", "copy", "copy");
    copy.type = "button";
    copy.addEventListener("click", () => {
      const done = () => { copy.textContent = "copied"; setTimeout(() => (copy.textContent = "copy"), 1200); };
      if (navigator.clipboard) navigator.clipboard.writeText(code).then(done, () => (copy.textContent = "select and copy"));
      else copy.textContent = "select and copy";
    });
    head.appendChild(copy);
    const pre = el("pre");
    const c = el("code");
    if (lang) c.dataset.lang = lang;
    highlight(code, lang, c);
    pre.appendChild(c);
    box.appendChild(head);
    box.appendChild(pre);
    return box;
  }

  // ---- blocks ------------------------------------------------------------------------------
  // Written so a failing search cannot backtrack over a long run of spaces more than once (the reviewed
  // forms "\s*([^`\s]*)[^`]*$", "\s+(.*?)\s*#*\s*$" and "\s*\|?\s*" were quadratic: 4,000 spaces after
  // a "#" took 8 s): the fence's info string and the heading's text are cut by hand (fenceLang,
  // headingText).
  const FENCE = /^ {0,3}(`{3,}|~{3,})([^`]*)$/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*)$/;
  const fenceLang = (info) => info.trim().split(/\s/)[0];
  const headingText = (t) => { // the text without trailing spaces, closing #s and spaces before them
    t = t.trimEnd();
    let e = t.length;
    while (e > 0 && t[e - 1] === "#") e--;
    return t.slice(0, e).trimEnd();
  };
  const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}> ?(.*)$/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const TABLE_SEP = /^\s*(?:\|\s*)?:?-+:?\s*(?:\|\s*:?-+:?\s*)*(?:\|\s*)?$/;

  const cells = (line) => line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((s) => s.trim());
  const startsBlock = (line) => FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);

  // Block quotes and lists nest by recursion; past MAX_DEPTH levels the rest is shown as plain text (a
  // reply of thousands of '>' must not overflow the stack and leave the page stuck).
  const MAX_DEPTH = 32;

  function blocks(lines, parent, depth = 0) {
    if (depth > MAX_DEPTH) {
      const p = el("p");
      p.textContent = lines.join("\n");
      parent.appendChild(p);
      return;
    }
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (!line.trim()) { i++; continue; }
      if ((m = FENCE.exec(line))) { // to the closing fence of the same kind and at least the same length, or the end
        const fence = m[1], body = [];
        i++;
        while (i < lines.length && !(lines[i].trim().startsWith(fence[0].repeat(fence.length)) && /^\s*[`~]+\s*$/.test(lines[i]))) body.push(lines[i++]);
        i++;
        parent.appendChild(codeBlock(body.join("\n"), fenceLang(m[2])));
      } else if ((m = HEADING.exec(line))) {
        const h = el("h" + m[1].length);
        inline(headingText(m[2]), h);
        parent.appendChild(h);
        i++;
      } else if (RULE.test(line)) {
        parent.appendChild(el("hr"));
        i++;
      } else if (QUOTE.test(line)) {
        const body = [];
        while (i < lines.length && (m = QUOTE.exec(lines[i]))) { body.push(m[1]); i++; }
        const q = el("blockquote");
        blocks(body, q, depth + 1);
        parent.appendChild(q);
      } else if ((m = ITEM.exec(line))) {
        i = list(lines, i, parent, depth);
      } else if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-")) {
        const t = el("table"), head = el("tr");
        for (const c of cells(line)) { const th = el("th"); inline(c, th); head.appendChild(th); }
        t.appendChild(el("thead")).appendChild(head);
        const tb = t.appendChild(el("tbody"));
        i += 2;
        while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
          const tr = el("tr");
          for (const c of cells(lines[i])) { const td = el("td"); inline(c, td); tr.appendChild(td); }
          tb.appendChild(tr);
          i++;
        }
        parent.appendChild(t);
      } else { // a paragraph: to a blank line or another block; single newlines kept as line breaks
        const p = el("p");
        let first = true;
        while (i < lines.length && lines[i].trim() && (first || !startsBlock(lines[i]))) {
          if (!first) p.appendChild(el("br"));
          inline(lines[i].trim(), p);
          first = false;
          i++;
        }
        parent.appendChild(p);
      }
    }
  }

  // A list from lines[i]: its items (a deeper-indented item or line belongs to the item above, as a
  // nested list or more text). Returns the index after it.
  function list(lines, i, parent, depth) {
    const first = ITEM.exec(lines[i]);
    const indent = first[1].length, ordered = /\d/.test(first[2]);
    const ul = el(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) ul.start = parseInt(first[2], 10);
    while (i < lines.length) {
      const m = ITEM.exec(lines[i]);
      if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
      const li = el("li"), sub = [];
      inline(m[3], li);
      i++;
      // the item's own lines: more indented, or a blank line followed by such
      while (i < lines.length) {
        const l = lines[i];
        const deeper = l.trim() && l.length - l.trimStart().length > indent;
        if (deeper) { sub.push(l); i++; continue; }
        if (!l.trim() && i + 1 < lines.length && lines[i + 1].trim() && lines[i + 1].length - lines[i + 1].trimStart().length > indent) { i++; continue; }
        break;
      }
      if (sub.length) {
        const cut = Math.min(...sub.map((l) => l.length - l.trimStart().length));
        const inner = sub.map((l) => l.slice(cut));
        blocks(inner, li, depth + 1);
      }
      ul.appendChild(li);
      // a blank line between two items of this list does not end it
      if (i + 1 < lines.length && !lines[i].trim()) {
        const next = ITEM.exec(lines[i + 1]);
        if (next && next[1].length === indent) i++;
      }
    }
    parent.appendChild(ul);
    return i;
  }

  // The reply text -> a DocumentFragment of its rendering.
  function render(text) {
    const frag = document.createDocumentFragment();
    blocks(String(text).replace(/\r\n?/g, "\n").split("\n"), frag);
    return frag;
  }

  return { render, inline };
})();
