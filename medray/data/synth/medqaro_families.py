"""Question families for the synthetic MedQARo-like corpus (paper: 48 breast, 61 lung, 7 other).

Each family has one fixed type, a few paraphrases (two are sampled per patient, as in the
paper) and an answer function over a ``Patient``. Conventions taken from the paper's
annotation guideline: a missing treatment or an empty list answers "Nu" (the row is then
typed binary), a value that cannot be computed answers "NK" (not known).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from medray.data.synth import medqaro_text as V
from medray.data.synth.medqaro_patient import Patient, months_between, years_between

NO, YES, NK = "Nu", "Da", "NK"


@dataclass(frozen=True)
class Family:
    key: str
    qtype: str  # binary | extractive | reasoning
    paraphrases: tuple[str, ...]
    answer: Callable[[Patient], str]


def _yn(flag: object) -> str:
    return YES if flag else NO


def _b(key: str, qs: tuple[str, ...], fn: Callable[[Patient], object]) -> Family:
    return Family(key, "binary", qs, lambda p: _yn(fn(p)))


def _first_treatment(p: Patient):
    dates = [d for *_, d in p.cht] + [x[-1] for x in (p.surgery, p.rt) if x]
    return min(dates) if dates else None


def _cycles(p: Patient) -> str:
    return str(sum(k for _, _, k, _ in p.cht))


def _months(a, b) -> str:
    return str(months_between(a, b)) if a and b else NK


def _subtype(p: Patient) -> str:
    her2 = p.her2 == "3+"
    if p.er or p.pr:
        if her2:
            return "Luminal B HER2 pozitiv"
        return "Luminal A" if p.ki67 < 20 and p.pr >= 20 else "Luminal B"
    return "HER2 pozitiv" if her2 else "triplu negativ"


def _met_family(key: str, text: str) -> Family:
    return _b(f"met_{key}", (f"S-au identificat metastaze {text}?",
                             f"Există determinări secundare {text} la acest pacient?",
                             f"Pacientul prezintă metastaze {text}?"),
              lambda p, k=key: k in p.mets)


_COMMON: list[Family] = [
    _b("surgery", ("S-a efectuat intervenție chirurgicală?", "Pacientul a fost operat?",
                   "A beneficiat pacientul de tratament chirurgical?"), lambda p: p.surgery),
    _b("cht", ("S-a administrat chimioterapie?", "A urmat pacientul tratament citostatic?"),
       lambda p: p.cht),
    _b("rt", ("S-a efectuat radioterapie?", "A beneficiat pacientul de tratament radioterapic?"),
       lambda p: p.rt),
    _b("progression", ("A prezentat pacientul progresie a bolii?",
                       "S-a constatat progresia bolii?"), lambda p: p.progression),
    _b("family", ("Există antecedente heredocolaterale oncologice?",
                  "Are pacientul istoric familial de cancer?"), lambda p: p.family),
    _b("hta", ("Pacientul are hipertensiune arterială?", "Este prezentă HTA ca și comorbiditate?"),
       lambda p: "HTA" in p.comorb),
    _b("diabetes", ("Pacientul are diabet zaharat?", "Este diabetul zaharat o comorbiditate?"),
       lambda p: "diabet zaharat tip 2" in p.comorb),
    _b("cardio", ("Pacientul are cardiopatie ischemică?",
                  "Este prezentă cardiopatia ischemică în antecedente?"),
       lambda p: "cardiopatie ischemică" in p.comorb),
    _b("death", ("A decedat pacientul?", "Este consemnat decesul pacientului?"),
       lambda p: p.death),
    _b("surgery_before_cht", ("Intervenția chirurgicală a precedat chimioterapia?",
                              "S-a realizat operația înainte de inițierea chimioterapiei?"),
       lambda p: p.surgery and p.cht and p.surgery[1] < p.cht[0][3]),
    _b("immuno", ("S-a administrat imunoterapie?", "A primit pacientul tratament imunoterapic?"),
       lambda p: p.immuno),
    *[_met_family(k, q) for k, _, q in V.MET_SITES],
    Family("histology", "extractive", ("Care este tipul histologic al tumorii?",
                                       "Ce subtip histologic are tumora conform histopatologiei?"),
           lambda p: p.histology),
    Family("tnm", "extractive", ("Care este stadializarea TNM a pacientului?",
                                 "Ce clasificare TNM are tumora la diagnostic?"), lambda p: p.tnm),
    Family("grade", "extractive", ("Care este gradul histologic al tumorii?",
                                   "Ce grad de diferențiere are tumora?"), lambda p: p.grade),
    Family("ki67", "extractive", ("Care este valoarea Ki-67?",
                                  "Ce indice de proliferare Ki-67 are tumora?"),
           lambda p: f"{p.ki67}%"),
    Family("ecog", "extractive", ("Ce status ECOG are pacientul?",
                                  "Specifică statusul de performanță ECOG"), lambda p: str(p.ecog)),
    Family("cht_scheme", "extractive", ("Ce schemă de chimioterapie s-a administrat inițial?",
                                        "Care a fost prima schemă de chimioterapie?"),
           lambda p: p.cht[0][1] if p.cht else NO),
    Family("rt_dose", "extractive", ("Ce doză de radioterapie s-a administrat?",
                                     "Care a fost doza totală de iradiere?"),
           lambda p: f"{p.rt[0]} Gy" if p.rt else NO),
    Family("size", "extractive",
           ("Care a fost dimensiunea tumorii la debut?",
            "Cât de mare era tumora atunci când a fost stabilit diagnosticul?"),
           lambda p: f"{p.size_mm} mm"),
    Family("laterality", "extractive", ("Care este lateralitatea tumorii?",
                                        "Pe ce parte este localizată tumora?"),
           lambda p: p.laterality or NK),
    Family("met_sites", "extractive", ("Care sunt localizările metastazelor?",
                                       "Unde s-au identificat metastaze?"),
           lambda p: ", ".join(V.MET_TEXT[s] for s in p.mets) or NO),
    Family("surgery_type", "extractive", ("Ce tip de intervenție chirurgicală s-a efectuat?",
                                          "Ce operație a suferit pacientul?"),
           lambda p: p.surgery[0] if p.surgery else NO),
    Family("dx_date", "extractive", ("Care este data diagnosticului?",
                                     "Când a fost stabilit diagnosticul?"),
           lambda p: V.fmt_date(p.dx)),
    Family("marker", "extractive", ("Care este valoarea markerului tumoral?",
                                    "Ce valoare au markerii tumorali?"),
           lambda p: f"{p.marker_value} {V.MARKERS[p.cancer][1]}"),
    Family("hb", "extractive",
           ("Care este valoarea hemoglobinei?", "Ce hemoglobină are pacientul?"),
           lambda p: f"{p.hb} g/dL"),
    Family("stage", "reasoning", ("Care este stadiul tumoral la diagnostic al pacientului?",
                                  "Ce stadiu de cancer a fost stabilit la diagnostic?"),
           lambda p: p.stage),
    Family("months_surgery_rt", "reasoning",
           ("Câte luni au trecut de la chirurgie până la începerea radioterapiei?",
            "La cât timp după operație a început tratamentul radioterapic?"),
           lambda p: _months(p.surgery and p.surgery[1], p.rt and p.rt[2])),
    Family("cycles", "reasoning",
           ("Câte cicluri de chimioterapie a primit pacientul în total?",
            "Care este numărul total de cicluri de chimioterapie?"), _cycles),
    Family("age_dx", "reasoning", ("Ce vârstă avea pacientul la diagnostic?",
                                   "La ce vârstă a fost diagnosticat pacientul?"),
           lambda p: str(years_between(p.birth, p.dx))),
    Family("months_tx_progression", "reasoning",
           ("Câte luni sunt de la începutul tratamentului până la apariția progresiei bolii?",
            "Cât a durat (în luni) ca boala să progreseze sub tratament?"),
           lambda p: _months(_first_treatment(p), p.progression)),
    Family("n_mets", "reasoning", ("Câte localizări metastatice are pacientul?",
                                   "Care este numărul de situsuri metastatice?"),
           lambda p: str(len(p.mets))),
    Family("bmi", "reasoning", ("Care este indicele de masă corporală al pacientului?",
                                "Ce IMC are pacientul?"),
           lambda p: f"{p.weight / (p.height / 100) ** 2:.1f}"),
    Family("months_dx_surgery", "reasoning",
           ("Câte luni au trecut de la diagnostic până la intervenția chirurgicală?",
            "La câte luni după diagnostic s-a efectuat operația?"),
           lambda p: _months(p.dx, p.surgery and p.surgery[1])),
]

_BREAST: list[Family] = [
    _b("ht", ("S-a administrat hormonoterapie?", "A primit pacienta tratament hormonal?"),
       lambda p: p.ht),
    _b("brca1", ("Pacienta are mutația BRCA1?",
                 "Rezultatul analizei genetice indică prezența mutației BRCA1?"),
       lambda p: p.brca1),
    _b("anti_her2", ("S-a administrat terapie anti-HER2?", "A primit pacienta Trastuzumab?"),
       lambda p: p.anti_her2),
    Family("quadrant", "extractive", ("Ce cadrane ale sânului sunt invadate de tumoră?",
                                      "Specifică localizarea tumorii în sân"),
           lambda p: p.location),
    Family("er", "extractive", ("Care este statusul receptorilor estrogenici?",
                                "Ce rezultat are ER la imunohistochimie?"),
           lambda p: f"pozitiv {p.er}%" if p.er else "negativ"),
    Family("her2", "extractive", ("Care este statusul HER2?", "Ce scor HER2 are tumora?"),
           lambda p: f"scor {p.her2}"),
    Family("menopause", "extractive", ("Care este statusul menopauzal al pacientei?",
                                       "Ce status menopauzal are pacienta?"),
           lambda p: p.menopause or NK),
    Family("subtype", "reasoning", ("Care este subtipul molecular al tumorii?",
                                    "Ce subtip molecular rezultă din profilul imunohistochimic?"),
           _subtype),
]

_LUNG: list[Family] = [
    _b("smoker", ("Pacientul este fumător?", "Are pacientul istoric de fumat?"),
       lambda p: p.smoker),
    *[_b(g.lower(), (f"Tumora prezintă mutație/rearanjament {g}?", f"Este {g} pozitiv?"),
         lambda p, g=g: p.mol.get(g)) for g in ("EGFR", "ALK", "ROS1", "KRAS")],
    _b("copd", ("Pacientul are BPOC?", "Este prezentă bronhopneumopatia obstructivă cronică?"),
       lambda p: "BPOC" in p.comorb),
    _b("targeted", ("S-a administrat terapie țintită?", "A primit pacientul tratament țintit?"),
       lambda p: p.targeted),
    _b("effusion", ("Există revărsat pleural?", "S-a evidențiat lichid pleural?"),
       lambda p: p.pleural_effusion),
    _b("brain_rt", ("S-a efectuat radioterapie cerebrală?",
                    "A primit pacientul iradiere cerebrală?"),
       lambda p: p.brain_rt),
    _b("weight_loss", ("A prezentat pacientul scădere ponderală?",
                       "Există scădere ponderală la debut?"),
       lambda p: "scădere ponderală" in p.symptoms),
    _b("hemoptysis", ("A prezentat pacientul hemoptizie?", "Există hemoptizie la debut?"),
       lambda p: "hemoptizie" in p.symptoms),
    _b("second_line", ("S-au utilizat alte linii de tratament în progresia bolii?",
                       "S-a administrat chimioterapie de linia a doua?"),
       lambda p: any(lab == "linia 2" for lab, *_ in p.cht)),
    Family("pdl1", "extractive", ("Care este valoarea PD-L1?", "Ce expresie PD-L1 are tumora?"),
           lambda p: f"{p.pdl1}%"),
    Family("targeted_drug", "extractive", ("Ce terapie țintită s-a administrat?",
                                           "Cu ce inhibitor de tirozin-kinază a fost tratat?"),
           lambda p: p.targeted[0] if p.targeted else NO),
    Family("immuno_drug", "extractive", ("Ce imunoterapie s-a administrat?",
                                         "Cu ce agent imunoterapic a fost tratat pacientul?"),
           lambda p: p.immuno[0] if p.immuno else NO),
    Family("lobe", "extractive", ("În ce lob pulmonar este localizată tumora?",
                                  "Care este localizarea lobară a tumorii?"),
           lambda p: p.location),
    Family("second_scheme", "extractive", ("Ce schemă s-a folosit în linia a doua?",
                                           "Care a fost chimioterapia de linia a doua?"),
           lambda p: next((s for lab, s, *_ in p.cht if lab == "linia 2"), NO)),
    Family("rt_weeks", "reasoning", ("Câte săptămâni a durat radioterapia?",
                                     "Care a fost durata radioterapiei în săptămâni?"),
           lambda p: str(math.ceil(p.rt[1] / 5)) if p.rt else NK),
    Family("pack_years", "reasoning", ("Câte pachete-an a fumat pacientul?",
                                       "Care este indicele tabagic în pachete-an?"),
           lambda p: str(round(p.smoker[0] / 20 * p.smoker[1])) if p.smoker else "0"),
]

_BY_KEY = {f.key: f for f in _COMMON + _BREAST + _LUNG}

FAMILIES_PAPER: dict[str, list[Family]] = {
    "breast": [f for f in _COMMON if f.key not in ("immuno", "hb")] + _BREAST,
    "lung": _COMMON + _LUNG,
    "other": [_BY_KEY[k] for k in ("histology", "tnm", "stage", "surgery", "progression",
                                   "met_sites", "ecog")],
}

# Small scale: a dozen families per site, all three types, "Nu" a minority of all answers.
_SMALL_KEYS = {
    "breast": ("surgery", "rt", "met_bone", "met_liver", "family", "histology", "tnm", "ki67",
               "her2", "cht_scheme", "stage", "months_surgery_rt", "cycles", "age_dx"),
    "lung": ("smoker", "egfr", "met_brain", "progression", "histology", "tnm", "ecog", "lobe",
             "cht_scheme", "pdl1", "stage", "age_dx", "cycles"),
}
FAMILIES_SMALL: dict[str, list[Family]] = {
    site: [_BY_KEY[k] for k in keys] for site, keys in _SMALL_KEYS.items()
} | {"other": FAMILIES_PAPER["other"]}


def families_for(cancer: str, scale: str) -> list[Family]:
    table = FAMILIES_PAPER if scale == "paper" else FAMILIES_SMALL
    return table[cancer if cancer in ("breast", "lung") else "other"]
