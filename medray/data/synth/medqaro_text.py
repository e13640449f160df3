"""Romanian vocabulary and filler paragraphs for the synthetic MedQARo-like epicrises.

Everything here is plain data plus small pure helpers driven by a caller-supplied
``random.Random``, so the generators stay deterministic by seed.
"""

from __future__ import annotations

import random
from datetime import date, timedelta

IN_DOMAIN = ("breast", "lung")
CROSS_DOMAIN = ("head_neck", "melanoma", "renal", "bladder", "liver")
CANCER_TYPES = IN_DOMAIN + CROSS_DOMAIN

# Short diagnosis names (used in the "Diagnostic:" line).
DIAGNOSIS = {
    "breast": "carcinom mamar",
    "lung": "carcinom bronhopulmonar",
    "head_neck": "carcinom al sferei ORL",
    "melanoma": "melanom malign",
    "renal": "carcinom renal",
    "bladder": "carcinom vezical",
    "liver": "carcinom hepatocelular",
}

HISTOLOGY = {
    "breast": (
        "carcinom ductal invaziv",
        "carcinom lobular invaziv",
        "carcinom mucinos",
        "carcinom ductal invaziv",
    ),
    "lung": (
        "adenocarcinom",
        "carcinom scuamos",
        "carcinom cu celule mici",
        "adenocarcinom",
        "carcinom macrocelular",
    ),
    "head_neck": ("carcinom scuamos keratinizant", "carcinom scuamos nekeratinizant"),
    "melanoma": ("melanom nodular", "melanom cu extindere superficială", "melanom lentiginos"),
    "renal": ("carcinom renal cu celule clare", "carcinom renal papilar", "carcinom cromofob"),
    "bladder": ("carcinom urotelial", "carcinom urotelial papilar"),
    "liver": ("carcinom hepatocelular", "carcinom hepatocelular fibrolamelar"),
}

LOCATION = {
    "breast": (
        "cadran supero-extern",
        "cadran supero-intern",
        "cadran infero-extern",
        "cadran infero-intern",
        "retroareolar",
    ),
    "lung": ("lob superior", "lob inferior", "lob mijlociu"),
    "head_neck": ("laringe", "orofaringe", "cavitate orală", "hipofaringe"),
    "melanoma": ("trunchi", "membrul inferior", "membrul superior", "scalp"),
    "renal": ("pol superior renal", "pol inferior renal", "mediorenal"),
    "bladder": ("perete lateral vezical", "trigon vezical", "dom vezical"),
    "liver": ("segmentul VI hepatic", "segmentul VIII hepatic", "lobul hepatic stâng"),
}

CHT_SCHEMES = {
    "breast": ("AC", "EC", "Paclitaxel", "Docetaxel", "FEC", "TC"),
    "lung": ("Carboplatin-Pemetrexed", "Cisplatin-Etoposid", "Carboplatin-Paclitaxel",
             "Cisplatin-Vinorelbină", "Carboplatin-Gemcitabină"),
    "head_neck": ("Cisplatin", "TPF", "Carboplatin-5FU"),
    "melanoma": ("Dacarbazină", "Temozolomidă"),
    "renal": ("Gemcitabină", "Sunitinib"),
    "bladder": ("Gemcitabină-Cisplatin", "MVAC"),
    "liver": ("Sorafenib", "Gemcitabină-Oxaliplatin"),
}

SURGERY = {
    "breast": ("mastectomie radicală modificată", "sectorectomie", "tumorectomie"),
    "lung": ("lobectomie", "pneumonectomie", "segmentectomie"),
    "head_neck": ("laringectomie totală", "evidare ganglionară cervicală"),
    "melanoma": ("excizie largă", "biopsie de ganglion santinelă"),
    "renal": ("nefrectomie radicală", "nefrectomie parțială"),
    "bladder": ("cistectomie radicală", "rezecție transuretrală"),
    "liver": ("hepatectomie segmentară", "rezecție hepatică atipică"),
}

HORMONOTHERAPY = ("Tamoxifen", "Letrozol", "Anastrozol", "Exemestan")
IMMUNOTHERAPY = ("Pembrolizumab", "Nivolumab", "Atezolizumab", "Durvalumab")
TARGETED = ("Osimertinib", "Alectinib", "Erlotinib", "Gefitinib")

# (key, form written in the epicrisis, form used in questions)
MET_SITES = (
    ("bone", "osoase", "osoase"),
    ("liver", "hepatice", "hepatice"),
    ("lung", "pulmonare", "pulmonare"),
    ("brain", "cerebrale", "cerebrale"),
    ("adrenal", "suprarenaliene", "suprarenaliene"),
    ("pleura", "pleurale", "pleurale"),
    ("nodes", "ganglionare la distanță", "ganglionare la distanță"),
    ("skin", "cutanate", "cutanate"),
    ("peritoneum", "peritoneale", "peritoneale"),
)
MET_TEXT = {k: t for k, t, _ in MET_SITES}
MET_PRIOR = {  # relative odds of each site per cancer (unlisted -> 1)
    "breast": {"bone": 6, "liver": 4, "lung": 4, "brain": 2, "nodes": 3, "skin": 1},
    "lung": {"bone": 5, "liver": 3, "lung": 3, "brain": 5, "adrenal": 4, "pleura": 4},
}

FAMILY_RELATIVES = ("mama", "tatăl", "sora", "fratele", "bunica maternă", "mătușa")
FAMILY_CANCERS = ("neoplasm mamar", "neoplasm pulmonar", "neoplasm de colon",
                  "neoplasm ovarian", "neoplasm gastric")
COMORBIDITIES = ("HTA", "diabet zaharat tip 2", "cardiopatie ischemică", "BPOC",
                 "dislipidemie", "hipotiroidism")
MARKERS = {
    "breast": ("CA 15-3", "U/mL"),
    "lung": ("CEA", "ng/mL"),
    "head_neck": ("SCC", "ng/mL"),
    "melanoma": ("LDH", "U/L"),
    "renal": ("LDH", "U/L"),
    "bladder": ("CEA", "ng/mL"),
    "liver": ("AFP", "ng/mL"),
}

FIRST_NAMES_F = ("Maria", "Elena", "Ioana", "Ana", "Mihaela", "Cristina", "Gabriela", "Doina")
FIRST_NAMES_M = ("Ion", "Gheorghe", "Vasile", "Constantin", "Mihai", "Nicolae", "Dumitru")
LAST_INITIALS = "ABCDFGHIMNOPRSTV"


def fmt_date(d: date) -> str:
    return f"{d.day:02d}.{d.month:02d}.{d.year}"


def fmt_month(d: date) -> str:
    return f"{d.month:02d}.{d.year}"


# --- filler: clinical course, labs, imaging. Neutral wrt the QA facts (no metastasis
# findings, no treatments), so they never contradict an answer. ---

_LAB_SENTENCES = (
    "Hemoleucogramă: leucocite {leu} /mmc, neutrofile {neu} /mmc, trombocite {tr} /mmc.",
    "Biochimie: creatinină {cr} mg/dL, uree {ur} mg/dL, TGO {tgo} U/L, TGP {tgp} U/L.",
    "Ionogramă: sodiu {na} mmol/L, potasiu {k} mmol/L, calciu {ca} mg/dL.",
    "Glicemie {gl} mg/dL, bilirubină totală {bt} mg/dL, albumină {alb} g/dL.",
    "VSH {vsh} mm/h, fibrinogen {fib} mg/dL, proteina C reactivă {crp} mg/L.",
    "Coagulare: INR {inr}, APTT {aptt} secunde.",
)
_COURSE_SENTENCES = (
    "La data de {d} pacientul se prezintă pentru evaluare periodică, cu stare generală "
    "{stare}, afebril, echilibrat hemodinamic.",
    "Examen obiectiv: tegumente și mucoase {teg}, murmur vezicular prezent bilateral, "
    "zgomote cardiace ritmice, abdomen suplu, mobil cu respirația, nedureros la palpare.",
    "Tensiune arterială {ta1}/{ta2} mmHg, alură ventriculară {av} bătăi/minut, saturație "
    "periferică în oxigen {sat}% în aer atmosferic.",
    "Se administrează tratament simptomatic cu antiemetice și protectoare gastrice, cu "
    "evoluție {evol}.",
    "Toleranța la tratament a fost {tol}, fără reacții adverse de grad 3 sau 4 conform "
    "criteriilor CTCAE.",
    "Pacientul acuză astenie și fatigabilitate moderată, inapetență, fără alte acuze "
    "semnificative în ultimele {n} săptămâni.",
    "Se efectuează consult cardiologic la {d}: ECG cu ritm sinusal, fără modificări "
    "acute de fază terminală, fracție de ejecție {fe}%.",
    "Se recomandă continuarea monitorizării clinice și biologice, hidratare corespunzătoare "
    "și revenire la control peste {n} săptămâni.",
    "Ecografie abdominală la {d}: ficat de dimensiuni normale, colecist fără calculi, "
    "rinichi cu dimensiuni și ecostructură normală.",
    "Consult nutrițional: se recomandă dietă hiperproteică, fracționată, cu aport caloric "
    "adecvat și suplimente nutritive orale.",
    "Evaluare psiho-oncologică la {d}: pacientul este cooperant, orientat temporo-spațial, "
    "cu anxietate reactivă ușoară.",
    "Pe parcursul internării nu au existat evenimente intercurente, iar pacientul se "
    "externează în stare {stare}, cu recomandări.",
)
_STARE = ("bună", "relativ bună", "ameliorată", "staționară")
_TEG = ("normal colorate", "palide", "ușor palide")
_EVOL = ("favorabilă", "lent favorabilă", "bună")
_TOL = ("bună", "satisfăcătoare", "acceptabilă")


def _lab_values(rng: random.Random) -> dict[str, str]:
    u = rng.uniform
    return {
        "leu": f"{rng.randint(35, 110) * 100}", "neu": f"{rng.randint(15, 80) * 100}",
        "tr": f"{rng.randint(120, 420) * 1000}", "cr": f"{u(0.5, 1.4):.2f}",
        "ur": f"{rng.randint(18, 60)}", "tgo": f"{rng.randint(12, 60)}",
        "tgp": f"{rng.randint(10, 70)}", "na": f"{rng.randint(132, 146)}",
        "k": f"{u(3.4, 5.2):.1f}", "ca": f"{u(8.4, 10.4):.1f}", "gl": f"{rng.randint(75, 160)}",
        "bt": f"{u(0.3, 1.5):.1f}", "alb": f"{u(3.0, 4.8):.1f}", "vsh": f"{rng.randint(5, 70)}",
        "fib": f"{rng.randint(200, 550)}", "crp": f"{u(0.5, 40):.1f}", "inr": f"{u(0.9, 1.3):.2f}",
        "aptt": f"{rng.randint(25, 38)}",
    }


def filler_paragraph(rng: random.Random, start: date, span_days: int) -> str:
    """One neutral paragraph (~40-110 words) dated inside [start, start + span_days]."""
    d = start + timedelta(days=rng.randint(0, max(span_days, 1)))
    vals = _lab_values(rng) | {
        "d": fmt_date(d), "stare": rng.choice(_STARE), "teg": rng.choice(_TEG),
        "ta1": str(rng.randint(105, 160)), "ta2": str(rng.randint(60, 95)),
        "av": str(rng.randint(58, 104)), "sat": str(rng.randint(92, 99)),
        "evol": rng.choice(_EVOL), "tol": rng.choice(_TOL), "n": str(rng.randint(2, 12)),
        "fe": str(rng.randint(50, 65)),
    }
    n_course = rng.randint(2, 4)
    parts = [s.format(**vals) for s in rng.sample(_COURSE_SENTENCES, n_course)]
    parts += [s.format(**vals) for s in rng.sample(_LAB_SENTENCES, rng.randint(1, 3))]
    rng.shuffle(parts)
    return " ".join(parts)


def name_initials(rng: random.Random, sex: str) -> str:
    first = rng.choice(FIRST_NAMES_F if sex == "F" else FIRST_NAMES_M)
    return f"{first[0]}.{rng.choice(LAST_INITIALS)}."
