"""Synthetic oncology patients and their Romanian epicrises (MedQARo-like).

A ``Patient`` holds the facts; ``render_core`` writes them as labelled lines at fixed
positions ("Histologie: ...", "Ki-67: 30%") so that a tiny model can learn to read them;
``render_epicrisis`` appends neutral filler paragraphs up to a target word count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import date, timedelta

from medray.data.synth import medqaro_text as V


@dataclass
class Patient:
    pid: int
    cancer: str
    sex: str  # "F" | "M"
    initials: str
    birth: date
    dx: date
    admission: date
    laterality: str | None
    location: str
    size_mm: int
    histology: str
    grade: str
    t: int
    n: int
    m: int
    ki67: int
    ecog: int
    weight: int
    height: int
    marker_value: str
    hb: str
    family: str | None = None
    comorb: list[str] = field(default_factory=list)
    menopause: str | None = None
    er: int = 0
    pr: int = 0
    her2: str = "0"
    brca1: bool = False
    anti_her2: date | None = None
    surgery: tuple[str, date] | None = None
    cht: list[tuple[str, str, int, date]] = field(default_factory=list)  # label, scheme, n, start
    rt: tuple[int, int, date] | None = None  # dose Gy, fractions, start
    ht: tuple[str, date] | None = None
    immuno: tuple[str, date] | None = None
    targeted: tuple[str, date] | None = None
    progression: date | None = None
    mets: list[str] = field(default_factory=list)
    death: date | None = None
    smoker: tuple[int, int] | None = None  # cigarettes/day, years
    mol: dict[str, bool] = field(default_factory=dict)  # EGFR, ALK, ROS1, KRAS
    pdl1: int = 0
    symptoms: list[str] = field(default_factory=list)
    pleural_effusion: bool = False
    brain_rt: bool = False
    legacy: bool = False  # cedilla letters and CRLF line breaks in the raw text

    @property
    def tnm(self) -> str:
        return f"cT{self.t}N{self.n}M{self.m}"

    @property
    def stage(self) -> str:
        return stage_from_tnm(self.cancer, self.t, self.n, self.m)


def stage_from_tnm(cancer: str, t: int, n: int, m: int) -> str:
    """A simplified AJCC-like stage table (the real one has sub-categories we do not model)."""
    if m:
        return "IV"
    if cancer == "breast":
        if n == 3 or t == 4:
            return "IIIC" if n == 3 else "IIIB"
        if n == 2 or (t == 3 and n == 1):
            return "IIIA"
        if (t == 2 and n == 1) or (t == 3 and n == 0):
            return "IIB"
        if (t == 1 and n == 1) or (t == 2 and n == 0):
            return "IIA"
        return "IA"
    if cancer == "lung":
        if n == 3:
            return "IIIC" if t >= 3 else "IIIB"
        if n == 2:
            return "IIIB" if t >= 3 else "IIIA"
        if t == 4 or (t == 3 and n == 1):
            return "IIIA"
        if t == 3 or n == 1:
            return "IIB"
        return "IB" if t == 2 else "IA"
    if t == 4 or n >= 2:
        return "III"
    if t == 3 or n == 1:
        return "III" if n else "II"
    return "II" if t == 2 else "I"


def months_between(a: date, b: date) -> int:
    """Completed calendar months from a to b (what an annotator counts on a calendar)."""
    months = (b.year - a.year) * 12 + (b.month - a.month)
    return months - 1 if b.day < a.day else months


def years_between(a: date, b: date) -> int:
    return b.year - a.year - ((b.month, b.day) < (a.month, a.day))


def _days(rng: random.Random, lo: int, hi: int) -> timedelta:
    return timedelta(days=rng.randint(lo, hi))


def _weighted_sites(rng: random.Random, cancer: str, k: int, exclude: list[str]) -> list[str]:
    prior = V.MET_PRIOR.get(cancer, {})
    pool = [key for key, _, _ in V.MET_SITES if key not in exclude]
    chosen: list[str] = []
    for _ in range(min(k, len(pool))):
        weights = [prior.get(s, 1) for s in pool]
        pick = rng.choices(pool, weights=weights)[0]
        chosen.append(pick)
        pool.remove(pick)
    return chosen


def make_patient(rng: random.Random, pid: int, cancer: str) -> Patient:
    """Sample one patient with a coherent timeline (diagnosis -> treatments -> progression)."""
    breast, lung = cancer == "breast", cancer == "lung"
    sex = "F" if breast else rng.choice("FMM")
    dx = date(2014, 1, 1) + _days(rng, 0, 8 * 365)
    age = rng.randint(34, 82)
    birth = dx - timedelta(days=age * 365 + rng.randint(0, 364))
    t = rng.choices((1, 2, 3, 4), weights=(3, 4, 2, 1))[0]
    n = rng.choices((0, 1, 2, 3), weights=(4, 3, 2, 1))[0]
    m = int(rng.random() < {"breast": 0.12, "lung": 0.3}.get(cancer, 0.15))
    p = Patient(
        pid=pid, cancer=cancer, sex=sex, initials=V.name_initials(rng, sex), birth=birth, dx=dx,
        admission=dx, laterality=rng.choice(("stâng", "drept")) if cancer in
        ("breast", "lung", "renal") else None, location=rng.choice(V.LOCATION[cancer]),
        size_mm=rng.randint(6, 30) * t + rng.randint(0, 9),
        histology=rng.choice(V.HISTOLOGY[cancer]),
        grade=rng.choice(("G1", "G2", "G2", "G3")), t=t, n=n, m=m,
        ki67=rng.choice((5, 10, 15, 20, 25, 30, 40, 50, 60, 70, 80)),
        ecog=rng.choices((0, 1, 2, 3), weights=(4, 4, 2, 1))[0],
        weight=rng.randint(48, 105), height=rng.randint(150, 188) + (8 if sex == "M" else 0),
        marker_value=f"{rng.uniform(2, 120):.1f}", hb=f"{rng.uniform(9.0, 15.5):.1f}",
    )
    if rng.random() < 0.3:
        p.family = f"{rng.choice(V.FAMILY_RELATIVES)} - {rng.choice(V.FAMILY_CANCERS)}"
    p.comorb = [c for c in V.COMORBIDITIES if rng.random() < (0.35 if c == "HTA" else 0.15)]
    if breast:
        p.menopause = ("postmenopauză" if age >= 50
                       else rng.choice(("premenopauză", "perimenopauză")))
        p.er = rng.choice((0, 0, 60, 80, 90, 95, 100))
        p.pr = rng.choice((0, 10, 30, 50, 70)) if p.er else rng.choice((0, 0, 0, 10))
        p.her2 = rng.choice(("0", "1+", "2+", "3+", "3+"))
        p.brca1 = rng.random() < 0.12
    if lung:
        if rng.random() < 0.75:
            p.smoker = (rng.choice((10, 15, 20, 20, 30, 40)), rng.randint(10, 45))
            if rng.random() < 0.4 and "BPOC" not in p.comorb:
                p.comorb.append("BPOC")
        p.mol = {g: rng.random() < pr for g, pr in
                 (("EGFR", 0.15), ("ALK", 0.06), ("ROS1", 0.03), ("KRAS", 0.2))}
        p.pdl1 = rng.choice((0, 0, 1, 5, 20, 50, 70, 90))
        p.symptoms = [s for s, pr in (("tuse", 0.7), ("hemoptizie", 0.3), ("dispnee", 0.5),
                                      ("scădere ponderală", 0.35)) if rng.random() < pr]
        p.pleural_effusion = rng.random() < 0.2
    if m:
        p.mets = _weighted_sites(rng, cancer, rng.randint(1, 2), [])
    _treatments(rng, p)
    last = max([p.dx] + [d for *_, d in p.cht] + [x[-1] for x in
               (p.surgery, p.rt, p.ht, p.immuno, p.targeted) if x] +
               [d for d in (p.progression, p.anti_her2) if d])
    p.admission = last + _days(rng, 10, 60)
    if rng.random() < (0.25 if p.progression else 0.04):
        p.death = p.admission + _days(rng, 20, 300)
    p.legacy = rng.random() < 0.15
    return p


def _treatments(rng: random.Random, p: Patient) -> None:
    c = p.cancer
    schemes = V.CHT_SCHEMES[c]
    cycle_end = lambda start, k: start + timedelta(days=21 * k)  # noqa: E731 - 3-week cycles
    ready = p.dx + _days(rng, 15, 45)  # when the next treatment can start
    surgery_p = {"breast": 0.9, "lung": 0.55 if p.t <= 2 and p.n <= 1 else 0.2}.get(c, 0.7)
    if not p.m and rng.random() < surgery_p:
        if c == "breast" and rng.random() < 0.25:
            k = rng.choice((4, 6, 8))
            p.cht.append(("neoadjuvantă", rng.choice(schemes), k, ready))
            ready = cycle_end(ready, k) + _days(rng, 20, 45)
        p.surgery = (rng.choice(V.SURGERY[c]), ready)
        ready = ready + _days(rng, 25, 60)
        if not p.cht and rng.random() < {"breast": 0.6, "lung": 0.5}.get(c, 0.3):
            k = rng.choice((4, 4, 6))
            p.cht.append(("adjuvantă", rng.choice(schemes), k, ready))
            ready = cycle_end(ready, k) + _days(rng, 20, 75)
    elif rng.random() < 0.85:
        k = rng.choice((4, 6))
        p.cht.append(("paliativă linia 1", rng.choice(schemes), k, ready))
        ready = cycle_end(ready, k) + _days(rng, 15, 60)
    rt_p = {"breast": 0.75 if p.surgery else 0.2, "lung": 0.45}.get(c, 0.4)
    if rng.random() < rt_p:
        dose, fr = rng.choice({"breast": ((50, 25), (42, 16), (40, 15)),
                               "lung": ((60, 30), (66, 33), (30, 10))}.get(c, ((70, 35), (50, 20))))
        p.rt = (dose, fr, ready)
        ready = ready + timedelta(days=fr * 7 // 5) + _days(rng, 10, 40)
    if c == "breast" and p.er and rng.random() < 0.9:
        p.ht = (rng.choice(V.HORMONOTHERAPY), ready)
    if c == "breast" and p.her2 == "3+" and rng.random() < 0.9:
        p.anti_her2 = (p.cht[0][3] if p.cht else ready)
    if c == "lung" and (p.mol.get("EGFR") or p.mol.get("ALK")):
        p.targeted = ("Alectinib" if p.mol.get("ALK") else rng.choice(("Osimertinib", "Erlotinib",
                                                                       "Gefitinib")), ready)
    elif rng.random() < {"lung": 0.35, "melanoma": 0.6, "renal": 0.4, "bladder": 0.3}.get(c, 0.15):
        p.immuno = (rng.choice(V.IMMUNOTHERAPY), ready)
    prog_p = 0.2 + (0.25 if p.stage.startswith(("III", "IV")) else 0) + (0.25 if p.m else 0)
    if rng.random() < prog_p:
        p.progression = p.dx + _days(rng, 200, 1500)
        if rng.random() < 0.7:
            p.mets += _weighted_sites(rng, c, rng.randint(1, 2), p.mets)
        if rng.random() < 0.6:
            p.cht.append(("linia 2", rng.choice(schemes), rng.choice((3, 4, 6)),
                          p.progression + _days(rng, 10, 40)))
        p.brain_rt = "brain" in p.mets and rng.random() < 0.7


def _yes(flag: bool, yes: str, no: str) -> str:
    return yes if flag else no


def render_core(p: Patient) -> list[str]:
    """The labelled fact lines, in a fixed order (the head of the epicrisis)."""
    f = V.fmt_date
    who = "Pacienta" if p.sex == "F" else "Pacientul"
    side = f" {p.laterality}" if p.laterality else ""
    organ = {"breast": "sân", "lung": "plămân", "renal": "rinichi"}.get(p.cancer)
    loc = f"{organ}{side}, {p.location}" if organ else p.location
    age = years_between(p.birth, p.admission)
    lines = [
        "EPICRIZĂ",
        f"{who} {p.initials}, în vârstă de {age} de ani, internat{'ă' if p.sex == 'F' else ''} "
        f"la data de {f(p.admission)} în Secția de Oncologie Medicală.",
        f"Data nașterii: {f(p.birth)}. Sex: {'feminin' if p.sex == 'F' else 'masculin'}.",
        f"Diagnostic: {V.DIAGNOSIS[p.cancer]}{side} {p.tnm}.",
        f"Data diagnosticului: {f(p.dx)}.",
        f"Localizare: {loc}.",
        f"Dimensiune tumorală: {p.size_mm} mm.",
        f"TNM: {p.tnm}.",
        f"Histologie: {p.histology}.",
        f"Grad histologic: {p.grade}.",
    ]
    if p.cancer == "breast":
        rec = lambda v: f"pozitiv {v}%" if v else "negativ"  # noqa: E731
        fish = ", FISH negativ" if p.her2 == "2+" else ""
        lines.append(f"ER: {rec(p.er)}. PR: {rec(p.pr)}. HER2: scor {p.her2}{fish}.")
    lines += [f"Ki-67: {p.ki67}%.", f"ECOG: {p.ecog}."]
    if p.menopause:
        lines.append(f"Status menopauzal: {p.menopause}.")
    lines += [
        f"Greutate: {p.weight} kg. Înălțime: {p.height} cm.",
        f"Antecedente heredocolaterale: {p.family or 'fără antecedente oncologice'}.",
        f"Comorbidități: {', '.join(p.comorb) or 'fără comorbidități semnificative'}.",
    ]
    if p.cancer == "breast":
        lines.append(f"BRCA1: {_yes(p.brca1, 'mutație prezentă', 'mutație absentă')}.")
    if p.cancer == "lung":
        smoke = (f"da, {p.smoker[0]} țigări/zi timp de {p.smoker[1]} de ani" if p.smoker
                 else "nefumător")
        pos = {"EGFR": "mutant", "KRAS": "mutant"}
        mol = ", ".join(f"{g} {_yes(v, pos.get(g, 'pozitiv'), 'negativ')}"
                        for g, v in p.mol.items())
        lines += [f"Fumător: {smoke}.", f"Biologie moleculară: {mol}. PD-L1 TPS: {p.pdl1}%.",
                  f"Simptome la debut: {', '.join(p.symptoms) if p.symptoms else 'asimptomatic'}.",
                  f"Revărsat pleural: {_yes(p.pleural_effusion, 'prezent', 'absent')}."]
    name, unit = V.MARKERS[p.cancer]
    lines += [f"Markeri tumorali: {name} {p.marker_value} {unit}.", f"Hemoglobină: {p.hb} g/dL.",
              "Tratament:"]
    lines.append(f"Intervenție chirurgicală: {p.surgery[0]} la {f(p.surgery[1])}." if p.surgery
                 else "Intervenție chirurgicală: nu s-a efectuat.")
    for label, scheme, k, start in p.cht:
        lines.append(f"Chimioterapie {label}: schema {scheme}, {k} cicluri, început la {f(start)}.")
    if not p.cht:
        lines.append("Chimioterapie: nu s-a efectuat.")
    lines.append(f"Radioterapie: {p.rt[0]} Gy în {p.rt[1]} fracțiuni, început la {f(p.rt[2])}."
                 if p.rt else "Radioterapie: nu s-a efectuat.")
    if p.cancer == "breast":
        lines.append(f"Hormonoterapie: {p.ht[0]} din {f(p.ht[1])}." if p.ht
                     else "Hormonoterapie: nu s-a efectuat.")
        lines.append(f"Terapie anti-HER2: Trastuzumab din {f(p.anti_her2)}." if p.anti_her2
                     else "Terapie anti-HER2: nu s-a efectuat.")
    for label, x in (("Imunoterapie", p.immuno), ("Terapie țintită", p.targeted)):
        if x:
            lines.append(f"{label}: {x[0]} din {f(x[1])}.")
    if p.brain_rt:
        lines.append("Radioterapie cerebrală paliativă pentru metastazele cerebrale.")
    lines.append(f"Evoluție: progresie la {f(p.progression)}." if p.progression
                 else "Evoluție: fără semne de progresie a bolii.")
    mets = ", ".join(V.MET_TEXT[s] for s in p.mets)
    lines.append(f"Metastaze: {mets}." if mets else "Metastaze: absente.")
    lines.append(f"Deces: {f(p.death)}." if p.death else "Status la externare: în viață.")
    if p.cancer not in V.IN_DOMAIN:  # the cross-domain patients come from another centre
        lines = [_relabel(x) for x in lines]
    return lines


# The other centre's template: same facts, different labels (a real cross-centre shift).
_OTHER_CENTRE = {
    "EPICRIZĂ": "SCRISOARE MEDICALĂ",
    "Histologie:": "Examen histopatologic:",
    "TNM:": "Stadializare TNM:",
    "ECOG:": "Status de performanță ECOG:",
    "Intervenție chirurgicală:": "Tratament chirurgical:",
    "Evoluție:": "Evoluția bolii:",
    "Metastaze:": "Determinări secundare:",
}


def _relabel(line: str) -> str:
    for old, new in _OTHER_CENTRE.items():
        if line.startswith(old):
            return new + line[len(old):]
    return line


def render_epicrisis(p: Patient, rng: random.Random, target_words: int) -> str:
    """Core facts first, then neutral filler paragraphs until ``target_words`` is reached."""
    lines = render_core(p)
    words = sum(len(x.split()) for x in lines)
    lines.append("Istoric și evoluție clinică:")
    span = max((p.admission - p.dx).days, 30)
    while words < target_words:
        para = V.filler_paragraph(rng, p.dx, span)
        lines.append(para)
        words += len(para.split())
    text = "\n".join(lines)
    if p.legacy:  # old Windows exports: cedilla letters, CRLF line breaks
        text = text.translate(_TO_CEDILLA).replace("\n", "\r\n")
    return text


_TO_CEDILLA = str.maketrans({"ș": "ş", "ț": "ţ", "Ș": "Ş", "Ț": "Ţ"})
